//! One NIC: its listener, its streams, its key table and its IO thread.
//!
//! Everything here runs under the provider's one lock; the IO thread
//! takes it for each batch of readiness events and gives it back before
//! it calls any consumer handler ([`Cb`], queued by whoever produced it
//! and delivered by the IO thread in order). A verb that queued a
//! callback wakes the thread ([`Dev::kick`]); one that only sent bytes
//! does not.
//!
//! Each poll does bounded work: at most [`READS_PER_EVENT`] reads of a
//! stream per readiness (a stream with more is revisited at once, after
//! the others), and the transmit loop stops once [`OUT_HIGH`] bytes wait
//! for the socket (the rest goes when the socket is writable again).

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

use iwarp::{Connection, Event, RecvWqe, Role, SendWqe, State};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use rdma_types::{Instant, QpState};
use verbs::kit::keys::KeyTable;
use verbs::{AsyncEvent, AsyncEventKind, EventHandler, ResourceKind};

use crate::capture::Capture;
use crate::cm::{CmConnected, CmError, CmRequest};
use crate::mem::{NoMem, QpMem, Taken};
use crate::post::to_wc;
use crate::rendezvous::Rendezvous;
use crate::{gid_ip, Inner, NicOptions, Obj, Shared, SoftIwarp};

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);

/// Reads of one stream per readiness event.
const READS_PER_EVENT: usize = 16;

/// Bytes queued for a socket before the transmit loop writes them.
const OUT_HIGH: usize = 1 << 20;

/// Fill-and-write rounds of one stream per pump.
const WRITE_ROUNDS: usize = 8;

/// A consumer callback, delivered by the IO thread with no lock held.
pub(crate) enum Cb {
    Completion(Arc<dyn EventHandler>, u64),
    Async(Arc<dyn EventHandler>, AsyncEvent),
    Destroyed(Arc<dyn EventHandler>, ResourceKind, u64),
    /// A CM-made stream under a QP ended (the CM's disconnect hook).
    Closed(crate::cm::ClosedHook, rdma_types::Guid, rdma_types::Qpn),
    /// An MPA request for a CM listener's consumer.
    Request(crate::cm::RequestSink, CmRequest),
    /// A CM's deferred call.
    Call(Box<dyn FnOnce() + Send>),
}

impl Cb {
    fn deliver(self) {
        match self {
            Cb::Completion(h, ctx) => h.on_completion(ctx),
            Cb::Async(h, ev) => h.on_async_event(ev),
            Cb::Destroyed(h, kind, ctx) => h.on_destroyed(kind, ctx),
            Cb::Closed(h, guid, qpn) => h(guid, qpn),
            Cb::Request(sink, req) => sink(req),
            Cb::Call(f) => f(),
        }
    }
}

/// One TCP stream and its engine.
pub(crate) struct Conn {
    stream: TcpStream,
    /// The iWARP connection on the stream.
    engine: Connection,
    /// The QP it carries, once bound.
    qp: Option<usize>,
    /// Bytes the socket has not taken yet.
    out: Vec<u8>,
    peer: SocketAddr,
    /// A responder's MPA request waiting for its QP to reach RTR.
    parked: Option<Rendezvous>,
    /// Close once `out` is written.
    closing: bool,
    /// When the stream was accepted or connected.
    born: Instant,
    /// Why the socket failed, when it did (a connect refused, a reset):
    /// what a CM connect waiting on it is told.
    failed: Option<ErrorKind>,
    /// Who made the stream and wants its negotiation's outcome.
    origin: Origin,
}

/// Who made a stream.
pub(crate) enum Origin {
    /// The verbs-only setup (INIT->RTR), its listener or its connect.
    Verbs,
    /// A CM listener (its token): the MPA request goes to its consumer.
    CmListen(Token),
    /// A CM connect for QP slot `qp`: bound once the reply accepts, the
    /// outcome sent to the waiting caller.
    CmConnect {
        qp: usize,
        /// The QP's number, to know it is still the QP in that slot.
        qpn: u32,
        waiter: Option<Sender<std::result::Result<CmConnected, CmError>>>,
    },
}

/// Keepalive and user timeout from [`NicOptions::dead_peer`], no Nagle
/// (we write whole FPDUs).
fn tune(s: socket2::SockRef<'_>, dead_peer: Duration) {
    let _ = s.set_nodelay(true);
    let ka = socket2::TcpKeepalive::new()
        .with_time((dead_peer / 2).max(Duration::from_secs(1)))
        .with_interval((dead_peer / 6).max(Duration::from_secs(1)))
        .with_retries(3);
    let _ = s.set_tcp_keepalive(&ka);
    let _ = s.set_tcp_user_timeout(Some(dead_peer));
}

/// A running NIC.
pub(crate) struct Dev {
    pub(crate) keys: KeyTable,
    pub(crate) qpns: HashMap<u32, usize>,
    conns: HashMap<Token, Conn>,
    listener: TcpListener,
    registry: Registry,
    waker: Arc<Waker>,
    pending: Vec<Cb>,
    next_qpn: u32,
    next_token: usize,
    stopping: bool,
    ip: IpAddr,
    base: iwarp::Config,
    dead_peer: Duration,
    /// [`NicOptions::cm_first_fpdu_hold`], in the engine's time.
    cm_first_fpdu_hold: rdma_types::Duration,
    /// CM listeners by token.
    pub(crate) cm_listeners: HashMap<Token, (TcpListener, crate::cm::RequestSink)>,
    pub(crate) shared: std::sync::Weak<Shared>,
    capture: Option<Capture>,
    /// Streams with more to send than one pump sent.
    again: Vec<Token>,
}

impl Dev {
    /// Binds the listener and starts the IO thread.
    pub(crate) fn start(
        shared: &Arc<Shared>,
        guid: u64,
        ip: IpAddr,
        options: &NicOptions,
    ) -> std::io::Result<Dev> {
        let poll = Poll::new()?;
        let mut listener = TcpListener::bind(SocketAddr::new(ip, options.port))?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let registry = poll.registry().try_clone()?;
        let mut base = iwarp::Config::new(Role::Responder);
        base.revision = options.mpa_revision;
        base.crc = options.crc;
        base.mulpdu = iwarp::mpa::mulpdu(options.path_mtu, iwarp::mpa::TCP_IPV4_OVERHEAD);
        let capture = match &options.capture_dir {
            Some(dir) => Some(Capture::create(&dir.join(format!("iwarp-{ip}.pcap")))?),
            None => None,
        };
        let sh = Arc::clone(shared);
        std::thread::Builder::new()
            .name(format!("iwarp-{ip}"))
            .spawn(move || run(sh, guid, poll))?;
        Ok(Dev {
            keys: KeyTable::new(),
            qpns: HashMap::new(),
            conns: HashMap::new(),
            listener,
            registry,
            waker,
            pending: Vec::new(),
            next_qpn: 16,
            next_token: 2,
            stopping: false,
            ip,
            base,
            dead_peer: options.dead_peer,
            cm_first_fpdu_hold: rdma_types::Duration::from_std(options.cm_first_fpdu_hold),
            cm_listeners: HashMap::new(),
            shared: Arc::downgrade(shared),
            capture,
            again: Vec::new(),
        })
    }

    pub(crate) fn defer(&mut self, cb: Cb) {
        self.pending.push(cb);
    }

    /// Wakes the IO thread if callbacks wait for it.
    pub(crate) fn kick(&mut self) {
        if !self.pending.is_empty() {
            let _ = self.waker.wake();
        }
    }

    pub(crate) fn stop(&mut self) {
        self.stopping = true;
        let _ = self.waker.wake();
    }

    pub(crate) fn ip(&self) -> IpAddr {
        self.ip
    }

    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }

    pub(crate) fn remove_cm_listener(&mut self, tok: Token) {
        if let Some((mut l, _)) = self.cm_listeners.remove(&tok) {
            let _ = self.registry.deregister(&mut l);
        }
    }

    pub(crate) fn new_qpn(&mut self) -> u32 {
        loop {
            let n = self.next_qpn;
            self.next_qpn = if n >= 0xff_fff0 { 16 } else { n + 1 };
            if !self.qpns.contains_key(&n) {
                return n;
            }
        }
    }

    pub(crate) fn token(&mut self) -> Token {
        self.next_token += 1;
        Token(self.next_token)
    }

    pub(crate) fn config(&self, role: Role, private_data: Vec<u8>) -> iwarp::Config {
        iwarp::Config {
            role,
            private_data,
            ..self.base.clone()
        }
    }
}

/// The IO thread of NIC `guid`.
fn run(shared: Arc<Shared>, guid: u64, mut poll: Poll) {
    let mut events = Events::with_capacity(256);
    let mut buf = vec![0u8; 64 * 1024];
    let mut again: Vec<Token> = Vec::new();
    let mut timeout: Option<Duration> = None;
    loop {
        let t = if again.is_empty() {
            timeout
        } else {
            Some(Duration::ZERO)
        };
        if let Err(e) = poll.poll(&mut events, t) {
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            tracing::error!(%e, "iWARP NIC IO thread: poll failed; the NIC stops");
            return;
        }
        let cbs = {
            let mut st = shared.lock();
            let now = shared.now();
            match st.devs.get(&guid) {
                Some(d) if !d.stopping => {}
                _ => {
                    st.devs.remove(&guid);
                    return;
                }
            }
            // Each stream named is read if it may have bytes, and pumped
            // (what waits is written, what came is handled) in any case.
            let mut ready: Vec<(Token, bool)> = events
                .iter()
                .map(|e| {
                    let r = e.is_readable() || e.is_read_closed() || e.is_error();
                    (e.token(), r)
                })
                .collect();
            ready.extend(again.drain(..).map(|t| (t, true)));
            if let Some(d) = st.devs.get_mut(&guid) {
                ready.extend(d.again.drain(..).map(|t| (t, false)));
            }
            for (tok, readable) in ready {
                match tok {
                    LISTENER => accept(&mut st, guid, tok, now),
                    WAKER => {}
                    _ if st
                        .devs
                        .get(&guid)
                        .is_some_and(|d| d.cm_listeners.contains_key(&tok)) =>
                    {
                        accept(&mut st, guid, tok, now)
                    }
                    _ => {
                        if readable && read(&mut st, guid, tok, now, &mut buf) {
                            again.push(tok);
                        }
                        pump(&mut st, guid, tok, now);
                    }
                }
            }
            timeout = timers(&mut st, guid, now);
            st.devs
                .get_mut(&guid)
                .map(|d| std::mem::take(&mut d.pending))
                .unwrap_or_default()
        };
        for cb in cbs {
            cb.deliver();
        }
    }
}

/// Runs due engine timers; returns how long until the next.
fn timers(st: &mut Inner, guid: u64, now: Instant) -> Option<Duration> {
    let d = st.devs.get_mut(&guid)?;
    let mut due = Vec::new();
    let mut next: Option<Instant> = None;
    let limit = d.dead_peer.as_micros() as u64;
    for (t, c) in d.conns.iter_mut() {
        if c.qp.is_none() && !c.closing {
            // A stream no QP took in time: a peer that never sent its
            // request, or asked for a QP that never reached RTR.
            let at = Instant::from_micros(c.born.total_micros().saturating_add(limit));
            if at <= now {
                tracing::debug!(peer = %c.peer, "iWARP stream closed: no QP took it in time");
                c.engine.abort();
                c.closing = true;
                due.push(*t);
                continue;
            }
            next = Some(next.map_or(at, |n| n.min(at)));
        }
        if let Some(at) = c.engine.poll_timeout() {
            if at <= now {
                c.engine.handle_timeout(now);
                due.push(*t);
            } else {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
    }
    for t in due {
        pump(st, guid, t, now);
    }
    next.map(|at| Duration::from_micros(at.total_micros().saturating_sub(now.total_micros())))
}

/// Takes the streams waiting on listener `l` (the verbs one or a CM's).
fn accept(st: &mut Inner, guid: u64, l: Token, now: Instant) {
    let Some(d) = st.devs.get_mut(&guid) else {
        return;
    };
    for _ in 0..64 {
        let got = if l == LISTENER {
            d.listener.accept()
        } else {
            match d.cm_listeners.get(&l) {
                Some((listener, _)) => listener.accept(),
                None => return,
            }
        };
        let (mut stream, peer) = match got {
            Ok(x) => x,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!(%e, ip = %d.ip, "iWARP NIC: accept failed");
                return;
            }
        };
        tune(socket2::SockRef::from(&stream), d.dead_peer);
        let tok = d.token();
        if let Err(e) =
            d.registry
                .register(&mut stream, tok, Interest::READABLE | Interest::WRITABLE)
        {
            tracing::warn!(%e, %peer, "iWARP NIC: cannot watch an accepted stream");
            continue;
        }
        let cfg = d.config(Role::Responder, Vec::new());
        let Ok(engine) = Connection::new(cfg, now) else {
            continue;
        };
        if let (Some(cap), Ok(local)) = (d.capture.as_mut(), stream.local_addr()) {
            cap.open(tok, local, peer, false);
        }
        d.conns.insert(
            tok,
            Conn {
                stream,
                engine,
                qp: None,
                out: Vec::new(),
                peer,
                parked: None,
                closing: false,
                born: now,
                failed: None,
                origin: if l == LISTENER {
                    Origin::Verbs
                } else {
                    Origin::CmListen(l)
                },
            },
        );
    }
}

/// Reads what the stream has into its engine. True when it may have more
/// (the read budget ran out first).
fn read(st: &mut Inner, guid: u64, tok: Token, now: Instant, buf: &mut [u8]) -> bool {
    let Inner { objs, devs, .. } = st;
    let Some(d) = devs.get_mut(&guid) else {
        return false;
    };
    let Dev {
        keys,
        conns,
        capture,
        pending,
        ..
    } = d;
    let Some(c) = conns.get_mut(&tok) else {
        return false;
    };
    for _ in 0..READS_PER_EVENT {
        if c.closing {
            return false;
        }
        match c.stream.read(buf) {
            Ok(0) => {
                if let Some(cap) = capture.as_mut() {
                    cap.close(tok, false);
                }
                c.engine.handle_stream_closed();
                return false;
            }
            Ok(n) => {
                if let Some(cap) = capture.as_mut() {
                    cap.data(tok, false, &buf[..n]);
                }
                let qp = c.qp.and_then(|s| match objs.get(s) {
                    Obj::Qp(q) => Some(&**q),
                    _ => None,
                });
                let taken = feed(c, qp, keys, now, &buf[..n]);
                if let (Some(t), Some(s)) = (taken, c.qp) {
                    if let Obj::Qp(q) = objs.get_mut(s) {
                        keep_taken(q, t, pending);
                    }
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::debug!(%e, peer = %c.peer, "iWARP stream read failed");
                // The first cause: a failed connect's (SO_ERROR) before what
                // later calls on the dead socket say (EPIPE).
                c.failed = c.failed.or_else(|| cause(&c.stream, &e));
                c.engine.handle_stream_closed();
                return false;
            }
        }
        // A responder holds further bytes until it answers the request.
        if c.engine.state() == State::RequestReceived {
            return false;
        }
    }
    true
}

/// Keeps what QP `q`'s engine took from its SRQ, and raises the SRQ's
/// limit event if it fired.
fn keep_taken(q: &mut crate::Qp, t: Taken, pending: &mut Vec<Cb>) {
    q.next_srq_id = t.next_id;
    for (stag, l) in t.sgls {
        q.sgls.insert(stag, l);
    }
    for (id, wr_id) in t.wrs {
        q.wrs.insert(
            id,
            crate::WrInfo {
                wr_id,
                opcode: rdma_types::WcOpcode::Recv,
                signaled: true,
                srq: true,
            },
        );
    }
    if let (true, Some(srq)) = (t.limit_fired, q.srq.as_ref()) {
        pending.push(Cb::Async(
            srq.handler.clone(),
            AsyncEvent {
                kind: AsyncEventKind::SrqLimitReached,
                ctx: srq.ctx,
                port: None,
            },
        ));
    }
}

/// Hands bytes the stream delivered to its engine, with the QP's memory
/// (none while no QP has the stream).
fn feed(
    c: &mut Conn,
    qp: Option<&crate::Qp>,
    keys: &KeyTable,
    now: Instant,
    bytes: &[u8],
) -> Option<Taken> {
    match qp {
        Some(q) => {
            let mut mem = qp_mem(q, keys);
            c.engine.handle_bytes(now, bytes, &mut mem);
            Some(mem.taken).filter(|t| !t.wrs.is_empty())
        }
        None => {
            c.engine.handle_bytes(now, bytes, &mut NoMem);
            None
        }
    }
}

/// QP `q`'s memory for its engine.
fn qp_mem<'a>(q: &'a crate::Qp, keys: &'a KeyTable) -> QpMem<'a> {
    QpMem {
        keys,
        pd: q.pd as u32,
        qpn: q.qpn,
        access: q.attr.access.unwrap_or(rdma_types::AccessFlags::NONE),
        sgls: &q.sgls,
        srq: q.srq.as_ref(),
        taken: Taken {
            next_id: q.next_srq_id,
            ..Taken::default()
        },
    }
}

/// Moves the engine's output to the socket and its events and completions
/// to the QP, until nothing changes (bounded).
pub(crate) fn pump(st: &mut Inner, guid: u64, tok: Token, now: Instant) {
    for _ in 0..8 {
        let Some((events, completions, qp, close)) = step(st, guid, tok, now) else {
            return;
        };
        if let Some(i) = qp {
            for c in &completions {
                complete(st, i, c);
            }
        }
        let quiet = events.is_empty();
        for ev in events {
            on_event(st, guid, tok, ev);
        }
        if close {
            close_conn(st, guid, tok);
            return;
        }
        if quiet {
            return;
        }
    }
}

type Step = (Vec<Event>, Vec<iwarp::Completion>, Option<usize>, bool);

/// One round: transmit, write, collect.
fn step(st: &mut Inner, guid: u64, tok: Token, now: Instant) -> Option<Step> {
    let Inner { objs, devs, .. } = st;
    let d = devs.get_mut(&guid)?;
    let Dev {
        keys,
        conns,
        capture,
        again,
        waker,
        ..
    } = d;
    let c = conns.get_mut(&tok)?;
    let qp = c.qp.and_then(|s| match objs.get(s) {
        Obj::Qp(q) => Some(&**q),
        _ => None,
    });
    // Rounds of filling `out` and writing it, until the socket is full
    // (its writable edge resumes us) or the engine has nothing more; a
    // stream that still has more after the last round is revisited by the
    // IO thread (`again`), so one busy stream cannot starve the others.
    let (mut qm, mut none);
    let mem: &mut dyn iwarp::Memory = match qp {
        // Sending takes no receive: nothing is taken from the SRQ.
        Some(q) => {
            qm = qp_mem(q, keys);
            &mut qm
        }
        None => {
            none = NoMem;
            &mut none
        }
    };
    let mut more = false;
    for _ in 0..WRITE_ROUNDS {
        // Full before the engine ran dry: it may have more.
        more = true;
        while c.out.len() < OUT_HIGH {
            if !c.engine.poll_transmit(now, mem, &mut c.out) {
                more = false;
                break;
            }
        }
        let mut written = 0;
        let mut blocked = false;
        while written < c.out.len() {
            match c.stream.write(&c.out[written..]) {
                Ok(0) => {
                    blocked = true;
                    break;
                }
                Ok(n) => written += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    blocked = true;
                    break;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::NotConnected => {
                    blocked = true;
                    break;
                }
                Err(e) => {
                    tracing::debug!(%e, peer = %c.peer, "iWARP stream write failed");
                    // The first cause: a failed connect's (SO_ERROR) before what
                    // later calls on the dead socket say (EPIPE).
                    c.failed = c.failed.or_else(|| cause(&c.stream, &e));
                    c.engine.handle_stream_closed();
                    c.out.clear();
                    c.closing = true;
                    written = 0;
                    blocked = true;
                    break;
                }
            }
        }
        if let Some(cap) = capture.as_mut().filter(|_| written > 0) {
            cap.data(tok, true, &c.out[..written]);
        }
        c.out.drain(..written);
        if blocked || !more {
            more = false;
            break;
        }
    }
    if more {
        again.push(tok);
        let _ = waker.wake();
    }
    let mut events = Vec::new();
    while let Some(e) = c.engine.poll_event() {
        events.push(e);
    }
    let mut completions = Vec::new();
    while let Some(x) = c.engine.poll_completion() {
        completions.push(x);
    }
    let done = matches!(c.engine.state(), State::Terminated | State::Closed);
    if done {
        c.closing = true;
    }
    let close = c.closing && c.out.is_empty() && events.is_empty();
    Some((events, completions, c.qp, close))
}

/// Why a socket call failed: the socket's pending error (a connect that
/// failed: refused, unreachable) when it has one, else `e`'s.
fn cause(stream: &TcpStream, e: &std::io::Error) -> Option<ErrorKind> {
    match stream.take_error() {
        Ok(Some(pending)) => Some(pending.kind()),
        _ => Some(e.kind()),
    }
}

fn on_event(st: &mut Inner, guid: u64, tok: Token, ev: Event) {
    let cm = st
        .devs
        .get_mut(&guid)
        .and_then(|d| d.conns.get_mut(&tok))
        .map(|c| match &mut c.origin {
            Origin::Verbs => None,
            Origin::CmListen(l) => Some((None, Some(*l), None)),
            Origin::CmConnect { qp, qpn, waiter } => Some((Some((*qp, *qpn)), None, waiter.take())),
        });
    let Some(cm) = cm else { return };
    match (ev, cm) {
        (Event::ConnectRequest { private_data, .. }, None) => request(st, guid, tok, &private_data),
        (
            Event::ConnectRequest {
                private_data,
                ird_ord,
            },
            Some((_, Some(l), _)),
        ) => cm_request(st, guid, tok, l, private_data, ird_ord),
        (Event::Established { .. }, None) => {}
        (
            Event::Established {
                private_data,
                ird,
                ord,
                ..
            },
            Some((qp, _, waiter)),
        ) => {
            let local = st
                .devs
                .get(&guid)
                .and_then(|d| d.conns.get(&tok))
                .and_then(|c| c.stream.local_addr().ok());
            // The QP may have been destroyed (its slot reused) meanwhile.
            let live = qp.filter(|&(i, qpn)| {
                let here = st.devs.get(&guid).and_then(|d| d.qpns.get(&qpn)) == Some(&i);
                here && matches!(st.objs.get(i), Obj::Qp(q) if q.conn.is_none())
            });
            match (live.map(|(i, _)| i), waiter, local) {
                (Some(i), Some(w), Some(local)) => {
                    bind(st, guid, tok, i);
                    let _ = w.send(Ok(CmConnected {
                        private_data,
                        ird,
                        ord,
                        local,
                    }));
                }
                // A listener's stream, accepted already.
                (None, _, _) if qp.is_none() => {}
                _ => {
                    if let Some(c) = st.devs.get_mut(&guid).and_then(|d| d.conns.get_mut(&tok)) {
                        c.engine.abort();
                        c.closing = true;
                    }
                }
            }
        }
        (Event::Rejected { private_data }, Some((_, _, Some(w)))) => {
            let _ = w.send(Err(CmError::Rejected { private_data }));
        }
        (ev, Some((_, _, Some(w)))) => {
            let c = st.devs.get(&guid).and_then(|d| d.conns.get(&tok));
            let peer = c.map(|c| c.peer);
            let e = match (c.and_then(|c| c.failed), peer) {
                (Some(ErrorKind::ConnectionRefused), Some(peer)) => CmError::Refused(peer),
                (Some(kind), _) => CmError::Failed(format!(
                    "the TCP connection failed before the MPA reply: {kind}"
                )),
                (None, _) if ev == Event::StreamClosed => CmError::Failed(
                    "the peer closed the TCP connection without an MPA reply".into(),
                ),
                (None, _) => CmError::Failed(format!("{ev:?}")),
            };
            let _ = w.send(Err(e));
        }
        (ev, cm) => {
            let qp = st
                .devs
                .get(&guid)
                .and_then(|d| d.conns.get(&tok))
                .and_then(|c| c.qp);
            let peer = st
                .devs
                .get(&guid)
                .and_then(|d| d.conns.get(&tok))
                .map(|c| c.peer);
            tracing::debug!(?ev, ?peer, "iWARP connection ended");
            if let Some(i) = qp {
                if cm.is_some() {
                    closed_hook(st, guid, i);
                }
                qp_fatal(st, i);
            }
        }
    }
}

/// Tells the CM that the stream under QP `i` ended.
fn closed_hook(st: &mut Inner, guid: u64, i: usize) {
    let qpn = rdma_types::Qpn::from_bits(st.qp_mut(i).qpn);
    if let Some(h) = st.cm_closed.get(&guid).cloned() {
        st.defer(guid, Cb::Closed(h, rdma_types::Guid(guid), qpn));
    }
}

/// A CM listener's MPA request: to its consumer, answered by
/// [`CmRequest::accept`] or [`CmRequest::reject`].
fn cm_request(
    st: &mut Inner,
    guid: u64,
    tok: Token,
    l: Token,
    private_data: Vec<u8>,
    ird_ord: Option<iwarp::mpa::IrdOrd>,
) {
    let Some(d) = st.devs.get_mut(&guid) else {
        return;
    };
    let Some(sink) = d.cm_listeners.get(&l).map(|(_, sink)| sink.clone()) else {
        reject(st, guid, tok, b"");
        return;
    };
    let Some(c) = d.conns.get(&tok) else { return };
    let req = CmRequest {
        local: c.stream.local_addr().unwrap_or(SocketAddr::new(d.ip, 0)),
        peer: c.peer,
        private_data,
        ird_ord: ird_ord.map(|x| (x.ird, x.ord)),
        guid: rdma_types::Guid(guid),
        tok,
        shared: d.shared.clone(),
    };
    d.defer(Cb::Request(sink, req));
}

/// Answers the MPA request on `tok` by binding QP `qpn` to it.
pub(crate) fn cm_accept(
    st: &mut Inner,
    guid: u64,
    tok: Token,
    qpn: u32,
    private_data: &[u8],
    now: Instant,
) -> std::result::Result<(), CmError> {
    let i = qp_for_cm(st, guid, qpn)?;
    let c = st
        .devs
        .get_mut(&guid)
        .and_then(|d| d.conns.get_mut(&tok))
        .filter(|c| c.engine.state() == State::RequestReceived)
        .ok_or(CmError::Gone)?;
    c.engine
        .accept(private_data)
        .map_err(|e| CmError::PrivateData(e.to_string()))?;
    bind(st, guid, tok, i);
    pump(st, guid, tok, now);
    Ok(())
}

/// Refuses the MPA request on `tok`.
pub(crate) fn cm_reject(st: &mut Inner, guid: u64, tok: Token, private_data: &[u8], now: Instant) {
    reject(st, guid, tok, private_data);
    pump(st, guid, tok, now);
}

/// The QP a CM may give a stream: of this NIC, INIT to RTS, streamless.
pub(crate) fn qp_for_cm(
    st: &mut Inner,
    guid: u64,
    qpn: u32,
) -> std::result::Result<usize, CmError> {
    let i = st
        .devs
        .get(&guid)
        .and_then(|d| d.qpns.get(&qpn).copied())
        .ok_or(CmError::NoSuchQp(qpn))?;
    let q = st.qp_mut(i);
    if q.conn.is_some() || !matches!(q.state, QpState::Init | QpState::Rtr | QpState::Rts) {
        return Err(CmError::QpNotReady(qpn));
    }
    Ok(i)
}

/// Abandons a CM connect: its stream closes.
pub(crate) fn cm_abandon(st: &mut Inner, guid: u64, tok: Token, now: Instant) {
    if let Some(c) = st.devs.get_mut(&guid).and_then(|d| d.conns.get_mut(&tok)) {
        if c.qp.is_none() {
            c.engine.abort();
            c.closing = true;
        }
    }
    pump(st, guid, tok, now);
}

/// A responder's MPA request: bind it to its QP, park it, or refuse it.
fn request(st: &mut Inner, guid: u64, tok: Token, pd: &[u8]) {
    let Some(r) = Rendezvous::parse(pd) else {
        // Not ours: a connection manager's streams come another way.
        reject(st, guid, tok, b"no listener for this private data");
        return;
    };
    let Some(c) = st.devs.get_mut(&guid).and_then(|d| d.conns.get_mut(&tok)) else {
        return;
    };
    c.parked = Some(r);
    let slot = st
        .devs
        .get(&guid)
        .and_then(|d| d.qpns.get(&r.responder_qpn).copied());
    match slot {
        Some(i) => {
            let st_q = st.qp_mut(i).state;
            if matches!(st_q, QpState::Reset | QpState::Init) {
                return; // parked until the QP reaches RTR
            }
            if !try_bind_parked(st, guid, tok, i) {
                reject(st, guid, tok, b"the QP does not expect this peer");
            }
        }
        None => reject(st, guid, tok, b"no such QP"),
    }
}

fn reject(st: &mut Inner, guid: u64, tok: Token, why: &[u8]) {
    if let Some(c) = st.devs.get_mut(&guid).and_then(|d| d.conns.get_mut(&tok)) {
        tracing::debug!(peer = %c.peer, why = %String::from_utf8_lossy(why), "iWARP MPA request refused");
        c.parked = None;
        c.engine.reject(why);
    }
}

/// Binds parked connection `tok` to QP `i` if the request is for it, from
/// the address and QP it expects, and answers it.
fn try_bind_parked(st: &mut Inner, guid: u64, tok: Token, i: usize) -> bool {
    let q = st.qp_mut(i);
    let (qpn, dest, want_ip, state, has_conn) = (
        q.qpn,
        q.attr.dest_qpn.map(|n| n.value()),
        q.attr.av.map(|a| gid_ip(a.dgid)),
        q.state,
        q.conn.is_some(),
    );
    if has_conn || !matches!(state, QpState::Rtr | QpState::Rts) {
        return false;
    }
    let Some(c) = st.devs.get_mut(&guid).and_then(|d| d.conns.get_mut(&tok)) else {
        return false;
    };
    let Some(r) = c.parked else { return false };
    if r.responder_qpn != qpn || Some(r.initiator_qpn) != dest || Some(c.peer.ip()) != want_ip {
        return false;
    }
    c.parked = None;
    let reply = r.emit();
    if c.engine.accept(&reply).is_err() {
        return false;
    }
    bind(st, guid, tok, i);
    true
}

/// Joins stream `tok` and QP `i`, handing the engine what waited.
fn bind(st: &mut Inner, guid: u64, tok: Token, i: usize) {
    let q = st.qp_mut(i);
    q.conn = Some(tok);
    let sq: Vec<SendWqe> = q.wait_sq.drain(..).collect();
    let rq: Vec<RecvWqe> = q.wait_rq.drain(..).collect();
    if let Some(c) = st.devs.get_mut(&guid).and_then(|d| d.conns.get_mut(&tok)) {
        c.qp = Some(i);
        for w in rq {
            c.engine.post_recv(w);
        }
        for w in sq {
            c.engine.post_send(w);
        }
    }
}

fn close_conn(st: &mut Inner, guid: u64, tok: Token) {
    let Some(d) = st.devs.get_mut(&guid) else {
        return;
    };
    let Some(mut c) = d.conns.remove(&tok) else {
        return;
    };
    let _ = d.registry.deregister(&mut c.stream);
    if let Some(cap) = d.capture.as_mut() {
        cap.close(tok, true);
    }
    if let Some(i) = c.qp {
        if let Obj::Qp(q) = st.objs.get_mut(i) {
            if q.conn == Some(tok) {
                q.conn = None;
            }
        }
    }
    // Dropping the stream closes it (a reset if the peer sent unread bytes).
}

/// The connection failed under QP `i`: the QP is in error, its owner told.
fn qp_fatal(st: &mut Inner, i: usize) {
    let q = st.qp_mut(i);
    if matches!(q.state, QpState::Err | QpState::Reset) {
        return;
    }
    q.state = QpState::Err;
    let ev = AsyncEvent {
        kind: AsyncEventKind::QpFatal,
        ctx: q.ctx,
        port: None,
    };
    let (h, guid) = (q.handler.clone(), q.guid);
    st.defer(guid, Cb::Async(h, ev));
    flush_waiting(st, i);
}

/// Completes what waited for an engine as flushed.
fn flush_waiting(st: &mut Inner, i: usize) {
    let q = st.qp_mut(i);
    let mut done: Vec<iwarp::Completion> = Vec::new();
    let flushed = |wr_id, kind| iwarp::Completion {
        wr_id,
        kind,
        status: iwarp::WcStatus::Flushed,
        byte_len: 0,
        invalidated: None,
        solicited: false,
    };
    for w in q.wait_rq.drain(..) {
        done.push(flushed(w.wr_id, iwarp::WcKind::Recv));
    }
    for w in q.wait_sq.drain(..) {
        let kind = match w.op {
            iwarp::SendOp::Send { .. } => iwarp::WcKind::Send,
            iwarp::SendOp::Write { .. } => iwarp::WcKind::Write,
            iwarp::SendOp::Read { .. } => iwarp::WcKind::Read,
        };
        done.push(flushed(w.wr_id, kind));
    }
    for c in &done {
        complete(st, i, c);
    }
}

/// Delivers an engine completion of QP `i` to its CQ.
fn complete(st: &mut Inner, i: usize, c: &iwarp::Completion) {
    let q = st.qp_mut(i);
    let Some((wc, recv, solicited)) = to_wc(q, c) else {
        return;
    };
    let mut cbs = Vec::new();
    if recv && wc.status.is_success() && q.state == QpState::Rtr && !q.comm_established {
        // IBA 11.6.3.1: the first message reaching an RTR QP.
        q.comm_established = true;
        cbs.push(Cb::Async(
            q.handler.clone(),
            AsyncEvent {
                kind: AsyncEventKind::CommEstablished,
                ctx: q.ctx,
                port: None,
            },
        ));
    }
    let cq = if recv { q.rcq.clone() } else { q.scq.clone() };
    let out = cq.cq.push(wc, solicited);
    if out.notify {
        cbs.push(Cb::Completion(cq.handler.clone(), cq.ctx));
    }
    if out.overflow {
        cbs.push(Cb::Async(
            cq.handler.clone(),
            AsyncEvent {
                kind: AsyncEventKind::CqError,
                ctx: cq.ctx,
                port: None,
            },
        ));
    }
    let guid = q.guid;
    for cb in cbs {
        st.defer(guid, cb);
    }
}

/// A send WR for QP `i`'s engine, or its wait queue, or flushed.
pub(crate) fn qp_post_send(st: &mut Inner, i: usize, w: SendWqe) {
    qp_post(st, i, w, Connection::post_send, |q| &mut q.wait_sq);
}

/// A receive WR for QP `i`'s engine, or its wait queue, or flushed.
pub(crate) fn qp_post_recv(st: &mut Inner, i: usize, w: RecvWqe) {
    qp_post(st, i, w, Connection::post_recv, |q| &mut q.wait_rq);
}

/// `w` to QP `i`'s engine when it has a connection, else to its wait
/// queue (`queue`), flushed at once if the QP is in error.
fn qp_post<W>(
    st: &mut Inner,
    i: usize,
    w: W,
    to_engine: fn(&mut Connection, W),
    queue: fn(&mut crate::Qp) -> &mut VecDeque<W>,
) {
    let q = st.qp_mut(i);
    let (guid, conn, err) = (q.guid, q.conn, q.state == QpState::Err);
    if let Some(c) = conn.and_then(|t| st.devs.get_mut(&guid).and_then(|d| d.conns.get_mut(&t))) {
        to_engine(&mut c.engine, w);
        return;
    }
    queue(st.qp_mut(i)).push_back(w);
    if err {
        flush_waiting(st, i);
    }
}

/// Sends what QP `i`'s engine has now (a verb's thread).
pub(crate) fn qp_pump(st: &mut Inner, i: usize, now: Instant) {
    let q = st.qp_mut(i);
    if let Some(t) = q.conn {
        let guid = q.guid;
        pump(st, guid, t, now);
    }
}

/// The consumer moved QP `i` to ERR (or it failed): flush everything and
/// close its stream.
pub(crate) fn qp_error(st: &mut Inner, i: usize) {
    let q = st.qp_mut(i);
    let (guid, conn) = (q.guid, q.conn);
    if let Some(t) = conn {
        if let Some(c) = st.devs.get_mut(&guid).and_then(|d| d.conns.get_mut(&t)) {
            c.engine.abort();
            c.closing = true;
        }
        pump(st, guid, t, Instant::ZERO);
    }
    flush_waiting(st, i);
}

/// Back to RESET: the stream goes, work is forgotten.
pub(crate) fn qp_reset(st: &mut Inner, i: usize) {
    qp_detach(st, i);
    let q = st.qp_mut(i);
    q.wait_sq.clear();
    q.wait_rq.clear();
    q.wrs.clear();
    q.sgls.clear();
    q.sq_out = 0;
    q.rq_out = 0;
    q.comm_established = false;
    q.attr = verbs::QpAttr::default();
}

/// Drops QP `i`'s stream without completing anything.
pub(crate) fn qp_detach(st: &mut Inner, i: usize) {
    let q = st.qp_mut(i);
    let (guid, conn) = (q.guid, q.conn.take());
    if let Some(t) = conn {
        if let Some(c) = st.devs.get_mut(&guid).and_then(|d| d.conns.get_mut(&t)) {
            c.qp = None;
            c.engine.abort();
            while c.engine.poll_completion().is_some() {}
        }
        close_conn(st, guid, t);
    }
}

/// INIT->RTR: connect to the peer, or answer its parked request.
pub(crate) fn qp_rtr(st: &mut Inner, i: usize, p: &SoftIwarp, now: Instant) {
    let q = st.qp_mut(i);
    let (guid, qpn) = (q.guid, q.qpn);
    let (Some(av), Some(dest)) = (q.attr.av, q.attr.dest_qpn) else {
        return;
    };
    let peer_ip = gid_ip(av.dgid);
    let Some(local_ip) = crate::ca_ip(p, guid) else {
        return;
    };
    let dest = dest.value();
    if q.conn.is_some() || dest == crate::CM_QPN.value() {
        // A CM gave (or will give) the QP its stream.
        return;
    }
    if (local_ip, qpn) < (peer_ip, dest) {
        let r = Rendezvous {
            initiator_qpn: qpn,
            responder_qpn: dest,
        };
        let to = crate::peer_addr(p, peer_ip);
        match connect(st, guid, local_ip, to, r.emit(), Origin::Verbs, now) {
            Ok(tok) => {
                bind(st, guid, tok, i);
                pump(st, guid, tok, now);
            }
            Err(e) => {
                tracing::warn!(%e, %peer_ip, "iWARP NIC: cannot connect");
                qp_fatal(st, i);
            }
        }
        return;
    }
    let parked: Vec<Token> = st
        .devs
        .get(&guid)
        .map(|d| {
            d.conns
                .iter()
                .filter(|(_, c)| c.parked.is_some_and(|r| r.responder_qpn == qpn))
                .map(|(t, _)| *t)
                .collect()
        })
        .unwrap_or_default();
    for t in parked {
        if try_bind_parked(st, guid, t, i) {
            pump(st, guid, t, now);
            return;
        }
    }
}

pub(crate) fn connect(
    st: &mut Inner,
    guid: u64,
    local: IpAddr,
    peer: SocketAddr,
    private_data: Vec<u8>,
    origin: Origin,
    now: Instant,
) -> std::io::Result<Token> {
    let d = st
        .devs
        .get_mut(&guid)
        .ok_or_else(|| std::io::Error::other("the NIC is not running"))?;
    let domain = if peer.is_ipv4() {
        socket2::Domain::IPV4
    } else {
        socket2::Domain::IPV6
    };
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    s.set_nonblocking(true)?;
    tune(socket2::SockRef::from(&s), d.dead_peer);
    // Leave from the CA's own address, which the peer checks.
    s.bind(&SocketAddr::new(local, 0).into())?;
    match s.connect(&peer.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        Err(e) => return Err(e),
    }
    let mut stream = TcpStream::from_std(std::net::TcpStream::from(s));
    let tok = d.token();
    d.registry
        .register(&mut stream, tok, Interest::READABLE | Interest::WRITABLE)?;
    if let (Some(cap), Ok(at)) = (d.capture.as_mut(), stream.local_addr()) {
        cap.open(tok, at, peer, true);
    }
    let mut cfg = d.config(Role::Initiator, private_data);
    // A CM's peer may be Linux siw, which is not ready for FPDUs the
    // moment its reply is out (`iwarp::Config::first_fpdu_hold`); the
    // verbs-only setup's peer is one of ours.
    if matches!(origin, Origin::CmConnect { .. }) {
        cfg.first_fpdu_hold = d.cm_first_fpdu_hold;
    }
    let engine = Connection::new(cfg, now).map_err(std::io::Error::other)?;
    d.conns.insert(
        tok,
        Conn {
            stream,
            engine,
            qp: None,
            out: Vec::new(),
            peer,
            parked: None,
            closing: false,
            born: now,
            failed: None,
            origin,
        },
    );
    Ok(tok)
}
