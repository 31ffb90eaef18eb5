//! RDMA CM over an iWARP NIC (issue 31, item 3): the access layer's
//! [`Service`], so the SRP target and initiator (and whatever else holds
//! an `Arc<dyn Service>`) connect over iWARP as they do over RoCE.
//!
//! On iWARP the RDMA CM is TCP plus MPA (as Linux's iw_cm over a driver's
//! connect/accept): a listen is a TCP listener on the port, a connect a
//! TCP connect whose MPA request carries the consumer's private data as
//! it is (no `cma_hdr`: the addresses are the stream's), the REP is the
//! MPA reply, a REJ a reply with the R bit (the consumer's reject
//! private data in it, reported as a consumer-defined reject, code 28),
//! and a DREQ the stream closing. There is no RTU: an accepted connection
//! is established once the reply is sent. QPs are named by their numbers
//! on the NIC; requests and connects report [`CM_QPN`] as the peer's QPN
//! and PSN 0, which the QP's INIT->RTR takes as "the stream comes from the
//! CM".

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdma_access::rdmacm::{Answer, ConnHook, IpRequest, Listened, Service};
use rdma_access::{CmError, ConnId, Established};
use rdma_types::{Gid, Guid, Mtu, Pkey, Psn, Qpn};

use crate::cm::{self, CmListener, CmRequest, CM_QPN};
use crate::SoftIwarp;

/// The REJ code of a consumer-defined reject (IBA 12.6.7.2), which MPA
/// rejects are reported as.
const CONSUMER_REJECT: u16 = 28;

/// RDMA CM on one NIC of a [`SoftIwarp`] provider.
pub struct IwarpCm {
    inner: Arc<Inner>,
}

struct Inner {
    p: Arc<SoftIwarp>,
    guid: Guid,
    next: AtomicU32,
    /// Live connections: ConnId <-> QPN on this NIC.
    conns: Mutex<HashMap<u32, Qpn>>,
    listeners: Mutex<Vec<CmListener>>,
    on_disconnect: Mutex<Option<ConnHook>>,
    on_established: Mutex<Option<ConnHook>>,
}

impl Inner {
    fn conn_of(&self, qpn: Qpn) -> Option<ConnId> {
        let g = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        g.iter().find(|(_, q)| **q == qpn).map(|(c, _)| ConnId(*c))
    }

    fn new_conn(&self) -> ConnId {
        ConnId(self.next.fetch_add(1, Ordering::Relaxed))
    }
}

impl IwarpCm {
    /// RDMA CM on NIC `guid` of `p` (which must be open: a consumer opened
    /// the CA).
    pub fn new(p: Arc<SoftIwarp>, guid: Guid) -> Arc<IwarpCm> {
        let inner = Arc::new(Inner {
            p: p.clone(),
            guid,
            next: AtomicU32::new(1),
            conns: Mutex::new(HashMap::new()),
            listeners: Mutex::new(Vec::new()),
            on_disconnect: Mutex::new(None),
            on_established: Mutex::new(None),
        });
        let weak = Arc::downgrade(&inner);
        p.cm_on_closed(
            guid,
            Arc::new(move |_, qpn| {
                let Some(inner) = weak.upgrade() else { return };
                let Some(conn) = inner.conn_of(qpn) else {
                    return;
                };
                inner
                    .conns
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&conn.0);
                let hook = inner
                    .on_disconnect
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                if let Some(h) = hook {
                    h(conn);
                }
            }),
        );
        Arc::new(IwarpCm { inner })
    }
}

/// Answers an MPA request for the consumer.
struct MpaAnswer {
    req: CmRequest,
    conn: ConnId,
    inner: Arc<Inner>,
}

impl Answer for MpaAnswer {
    fn accept(self: Box<Self>, qpn: Qpn, _psn: Psn, private_data: Vec<u8>) -> bool {
        let MpaAnswer { req, conn, inner } = *self;
        match req.accept(qpn, &private_data) {
            Ok(()) => {
                inner
                    .conns
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(conn.0, qpn);
                // Established at once (no RTU); told from the NIC's
                // thread, never inside the consumer's accept.
                let hook = inner
                    .on_established
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                if let Some(h) = hook {
                    inner.p.cm_defer(inner.guid, Box::new(move || h(conn)));
                }
                true
            }
            Err(e) => {
                tracing::debug!(%e, "iWARP RDMA CM: accept failed");
                false
            }
        }
    }

    fn reject(self: Box<Self>, private_data: Vec<u8>) {
        self.req.reject(&private_data);
    }
}

fn to_access(e: cm::CmError) -> CmError {
    match e {
        cm::CmError::Rejected { private_data } => CmError::Rejected {
            reason: "MPA reply with the reject bit (consumer defined)".into(),
            code: CONSUMER_REJECT,
            private_data,
        },
        // What RDMA CM over IB says when nothing listens (a REJ for the
        // service ID), so consumers tell "no listener" apart the same way.
        e @ cm::CmError::Refused(_) => CmError::Rejected {
            reason: e.to_string(),
            code: rdma_mad::cm::RejReason::InvalidServiceId.into(),
            private_data: Vec::new(),
        },
        cm::CmError::TimedOut => CmError::TimedOut,
        e => CmError::Library(format!("iWARP: {e}")),
    }
}

impl Service for IwarpCm {
    fn listen(&self, port: u16) -> Result<Receiver<Listened>, CmError> {
        let (tx, rx) = channel();
        let tx = Mutex::new(tx);
        let weak = Arc::downgrade(&self.inner);
        let sink: cm::RequestSink = Arc::new(move |req: CmRequest| {
            let Some(inner) = weak.upgrade() else {
                return req.reject(b"");
            };
            let conn = inner.new_conn();
            let ird = req.ird_ord.map_or(16, |(ird, _)| ird);
            let r = IpRequest {
                conn,
                src: req.peer,
                private_data: req.private_data.clone(),
                peer: Gid::from_ip(req.peer.ip()),
                remote_qpn: CM_QPN,
                remote_psn: Psn::new(0),
                mtu: Mtu::Mtu1024,
                pkey: Pkey::DEFAULT,
                initiator_depth: ird.min(16) as u8,
                ack_timeout: 14,
                local_psn: None,
                answer: Box::new(MpaAnswer { req, conn, inner }),
            };
            let tx = tx.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = tx.send(Ok(r)) {
                if let Ok(r) = e.0 {
                    r.reject(Vec::new());
                }
            }
        });
        let l = self
            .inner
            .p
            .cm_listen_with(self.inner.guid, port, sink)
            .map_err(to_access)?;
        self.inner
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(l);
        Ok(rx)
    }

    fn connect(
        &self,
        _src: IpAddr,
        dst: SocketAddr,
        qpn: Qpn,
        _psn: Psn,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<Established, CmError> {
        let i = &self.inner;
        let got =
            i.p.cm_connect(i.guid, qpn, dst, private_data, timeout)
                .map_err(to_access)?;
        let conn = i.new_conn();
        i.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(conn.0, qpn);
        Ok(Established {
            conn,
            remote_qpn: CM_QPN,
            remote_psn: Psn::new(0),
            private_data: got.private_data,
            local_psn: None,
        })
    }

    fn disconnect(&self, conn: ConnId) {
        let qpn = self
            .inner
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&conn.0);
        if let Some(qpn) = qpn {
            let _ = self.inner.p.cm_disconnect(self.inner.guid, qpn);
        }
    }

    fn disconnect_wait(&self, conn: ConnId, _within: Duration) -> bool {
        // The stream's close needs no answer.
        self.disconnect(conn);
        true
    }

    fn on_disconnect(&self, hook: ConnHook) {
        *self
            .inner
            .on_disconnect
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(hook);
    }

    fn on_established(&self, hook: ConnHook) {
        *self
            .inner
            .on_established
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(hook);
    }
}
