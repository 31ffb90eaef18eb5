//! The daemon's QP1 of each CA's port 1, shared by its clients: the
//! driver of a [`Router`] (see [`crate::mads`]). Opened on the first
//! client's [`Request::OpenGsi`](crate::proto::Request::OpenGsi), kept
//! while the daemon runs. A thread takes the QP's completions: each MAD
//! received goes through the router, and what it says goes to clients
//! (an [`Event::Mad`] on their connection) or back on the wire; once a
//! second it has the router send again the DREQs of departed clients
//! nobody answered.

use super::Outbox;
use crate::mads::{ClientId, Out, Refused, Router, Stats};
use crate::proto::{self, Event, Kind};
use rdma_access::{recv_ring, recv_wr, send_ring, source_gid, special_qp};
use rdma_types::{Gid, Guid, PortNum, Qkey, QpType, Qpn, WcOpcode, WcStatus};
use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use verbs::{
    AhAttr, AhHandle, CaHandle, CqHandle, CqInit, EventHandler, MemBuf, MrInfo, PdHandle, Provider,
    QpHandle, SendOpcode, SendWr, Sge, UdDest, VerbsError, WorkCompletion,
};

const MAD: usize = 256;
const GRH: usize = 40;
/// The rings of `rdma_access::recv_ring` and `send_ring`.
const SLOTS: u32 = 64;
const SEND: u64 = 1 << 40;

/// Where a client's MADs go.
struct User {
    out: Arc<Outbox>,
    /// The client's handles of its CA and of its GSI QP.
    ca: CaHandle,
    qp: QpHandle,
}

struct State {
    router: Router,
    users: HashMap<ClientId, User>,
    ahs: HashMap<Gid, AhHandle>,
    free: Vec<u32>,
    backlog: VecDeque<(Gid, u16, Box<[u8; MAD]>)>,
}

/// The daemon's QP1 of one port.
pub(super) struct GsiPort {
    provider: Arc<dyn Provider>,
    guid: Guid,
    pd: PdHandle,
    cq: CqHandle,
    qp: QpHandle,
    recv_buf: MemBuf,
    recv_mr: MrInfo,
    send_buf: MemBuf,
    send_mr: MrInfo,
    st: Mutex<State>,
}

struct Wake(Mutex<Sender<()>>);

impl EventHandler for Wake {
    fn on_completion(&self, _cq_ctx: u64) {
        let _ = self.0.lock().map(|tx| tx.send(()));
    }
    fn on_async_event(&self, _event: verbs::AsyncEvent) {}
}

impl GsiPort {
    /// Opens CA `guid`'s QP1 on `provider` and starts its thread.
    pub(super) fn open(provider: Arc<dyn Provider>, guid: Guid) -> verbs::Result<Arc<GsiPort>> {
        let (tx, rx) = channel();
        let p = &provider;
        let ca = p.open_ca(guid, 0, Arc::new(Wake(Mutex::new(tx))))?;
        let made = (|| {
            let pd = p.alloc_pd(ca, 0)?;
            let cq = p.create_cq(pd, &CqInit { cqe: 2 * SLOTS + 1 }, 0)?;
            let qp = special_qp(p, pd, cq, QpType::Gsi, Qkey::GSI, PortNum(1))?;
            let (recv_buf, recv_mr) = recv_ring(p, pd)?;
            let (send_buf, send_mr) = send_ring(p, pd)?;
            let recvs: Vec<_> = (0..SLOTS)
                .map(|i| recv_wr(&recv_buf, &recv_mr, i, 0))
                .collect();
            p.post_recv(qp, &recvs)?;
            p.req_notify_cq(cq, false)?;
            let _ = p.query_port(ca, PortNum(1))?;
            Ok(GsiPort {
                provider: provider.clone(),
                guid,
                pd,
                cq,
                qp,
                recv_buf,
                recv_mr,
                send_buf,
                send_mr,
                st: Mutex::new(State {
                    router: Router::new(seed()),
                    users: HashMap::new(),
                    ahs: HashMap::new(),
                    free: (0..SLOTS).rev().collect(),
                    backlog: VecDeque::new(),
                }),
            })
        })();
        let port = match made {
            Ok(port) => Arc::new(port),
            Err(e) => {
                // Closing the CA releases what was made under it.
                let _ = p.close_ca(ca);
                return Err(e);
            }
        };
        let me = Arc::downgrade(&port);
        std::thread::Builder::new()
            .name("nicd-qp1".into())
            .spawn(move || run(me, rx))
            .map_err(|e| VerbsError::InvalidArgument(format!("start the QP1 thread: {e}")))?;
        Ok(port)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Client `client` takes its place; its MADs go to `out` as
    /// receives of its QP `qp` of CA `ca`.
    pub(super) fn join(
        &self,
        client: ClientId,
        privileged: bool,
        out: Arc<Outbox>,
        ca: CaHandle,
        qp: QpHandle,
    ) {
        let mut st = self.lock();
        st.router.join(client, privileged);
        st.users.insert(client, User { out, ca, qp });
    }

    /// Client `client` is gone: its connections end (see [`Router::leave`]).
    pub(super) fn leave(&self, client: ClientId) {
        let mut st = self.lock();
        st.users.remove(&client);
        let outs = st.router.leave(client);
        self.carry_out(&mut st, outs);
    }

    /// [`Router::register`].
    pub(super) fn register(
        &self,
        client: ClientId,
        class: u8,
        version: u8,
        methods: &[u8],
        serve: bool,
    ) -> Result<(), Refused> {
        self.lock()
            .router
            .register(client, class, version, methods, serve)
    }

    /// The port's CA.
    pub(super) fn guid(&self) -> Guid {
        self.guid
    }

    /// Whether a client serves device management (class 0x06) here: the
    /// port's SMA then says IsDeviceManagementSupported.
    pub(super) fn serves_dm(&self) -> bool {
        self.lock().router.serves_class(0x06)
    }

    /// [`Router::listen`].
    pub(super) fn listen(
        &self,
        client: ClientId,
        service_id: u64,
        on: bool,
    ) -> Result<(), Refused> {
        self.lock().router.listen(client, service_id, on)
    }

    /// [`Router::from_client`], and what it says done.
    pub(super) fn send(
        &self,
        client: ClientId,
        dgid: Gid,
        pkey_index: u16,
        mad: &[u8],
    ) -> Result<(), Refused> {
        let mut st = self.lock();
        let outs = st.router.from_client(client, dgid, pkey_index, mad)?;
        self.carry_out(&mut st, outs);
        Ok(())
    }

    /// The router's counters.
    pub(super) fn stats(&self) -> Stats {
        self.lock().router.stats()
    }

    fn carry_out(&self, st: &mut State, outs: Vec<Out>) {
        for o in outs {
            match o {
                Out::ToClient {
                    client,
                    sgid,
                    pkey_index,
                    mad,
                } => {
                    if let Some(u) = st.users.get(&client) {
                        let e = Event::Mad {
                            ca: u.ca,
                            qp: u.qp,
                            sgid,
                            pkey_index,
                            mad: mad.to_vec(),
                        };
                        u.out.send(proto::frame(Kind::Event, 0, &e));
                    }
                }
                Out::ToWire {
                    dgid,
                    pkey_index,
                    mad,
                } => st.backlog.push_back((dgid, pkey_index, mad)),
            }
        }
        self.flush(st);
    }

    /// Posts what waits, while send slots are free.
    fn flush(&self, st: &mut State) {
        let p = &self.provider;
        while let Some(slot) = st.free.last().copied() {
            let Some((dgid, pkey_index, mad)) = st.backlog.pop_front() else {
                return;
            };
            let ah = match st.ahs.get(&dgid) {
                Some(a) => *a,
                None => match p.create_ah(self.pd, &AhAttr::roce(dgid)) {
                    Ok(a) => {
                        st.ahs.insert(dgid, a);
                        a
                    }
                    Err(e) => {
                        tracing::warn!("nicd: QP1: no address handle for {dgid}: {e}");
                        continue;
                    }
                },
            };
            let off = slot as usize * MAD;
            self.send_buf.write_at(off, &mad[..]);
            let mut wr = SendWr::new(
                SEND | u64::from(slot),
                SendOpcode::Send,
                vec![Sge {
                    addr: self.send_buf.addr() + off as u64,
                    length: MAD as u32,
                    lkey: self.send_mr.lkey,
                }],
            );
            wr.ud = Some(UdDest {
                ah,
                remote_qpn: Qpn::GSI,
                remote_qkey: Qkey::GSI,
            });
            wr.pkey_index = Some(pkey_index);
            st.free.pop();
            if let Err(e) = p.post_send(self.qp, &[wr]) {
                tracing::warn!("nicd: QP1: a send to {dgid}: {e}");
                st.free.push(slot);
            }
        }
    }

    fn on_wc(&self, wc: &WorkCompletion) {
        let mut st = self.lock();
        if wc.wr_id & SEND != 0 {
            st.free.push((wc.wr_id & !SEND) as u32);
            self.flush(&mut st);
            return;
        }
        let i = wc.wr_id as u32;
        if i >= SLOTS {
            return;
        }
        let off = i as usize * (GRH + MAD);
        let bytes = self.recv_buf.to_vec(off, GRH + MAD);
        let _ = self
            .provider
            .post_recv(self.qp, &[recv_wr(&self.recv_buf, &self.recv_mr, i, 0)]);
        if wc.status != WcStatus::Success || wc.opcode != WcOpcode::Recv {
            return;
        }
        let len = (wc.byte_len as usize).clamp(GRH, GRH + MAD) - GRH;
        let outs = st.router.from_wire(
            source_gid(&bytes[..GRH]),
            wc.pkey_index,
            &bytes[GRH..GRH + len],
        );
        self.carry_out(&mut st, outs);
    }
}

/// A varying first communication ID and transaction ID.
fn seed() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (t.subsec_nanos() ^ std::process::id().rotate_left(16)) & 0x7fff_ffff
}

/// How often the DREQs of departed clients go again
/// ([`Router::retransmit`]).
const RESEND_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

fn run(port: std::sync::Weak<GsiPort>, rx: Receiver<()>) {
    use std::sync::mpsc::RecvTimeoutError;
    let blank = WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0);
    let mut wcs = [blank; 16];
    let mut next_resend = std::time::Instant::now() + RESEND_EVERY;
    loop {
        let wait = next_resend.saturating_duration_since(std::time::Instant::now());
        let woken = rx.recv_timeout(wait);
        let Some(port) = port.upgrade() else {
            return;
        };
        if std::time::Instant::now() >= next_resend {
            next_resend = std::time::Instant::now() + RESEND_EVERY;
            let mut st = port.lock();
            let outs = st.router.retransmit();
            port.carry_out(&mut st, outs);
        }
        match woken {
            Ok(()) => {}
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let mut armed = false;
        loop {
            let n = port.provider.poll_cq(port.cq, &mut wcs).unwrap_or(0);
            for wc in &wcs[..n] {
                port.on_wc(wc);
            }
            if n == 0 {
                if armed || port.provider.req_notify_cq(port.cq, false).is_err() {
                    break;
                }
                armed = true;
            }
        }
    }
}
