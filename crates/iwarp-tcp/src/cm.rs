//! Connection management for a CM (issue 31, item 3): what Linux's iw_cm
//! asks of an iWARP driver, here as methods of the provider. A consumer
//! (the access layer's RDMA CM) listens on a TCP port of a NIC's address
//! and answers each MPA request with a QP of its own, or connects a QP to
//! a listener elsewhere; the private data of the MPA request and reply is
//! the CM's (for RDMA CM, the consumer's, since iWARP carries no CM
//! header). The provider does the TCP connect, the MPA exchange and the
//! binding of the stream to the QP; the consumer moves the QP through its
//! states as for any provider.
//!
//! A QP a CM connects names [`CM_QPN`] as its destination QPN at
//! INIT->RTR (iWARP has no QPNs on the wire; no peer has QP0), which
//! tells the provider not to start the verbs-only setup. The QP may take
//! its stream in INIT, RTR or RTS; receives posted before it are kept.
//! A disconnect is the QP moving to ERR (its stream closes); a stream a
//! CM made that ends under its QP is reported to the hook of
//! [`SoftIwarp::cm_on_closed`] (and to the QP's owner as `QpFatal`).

use std::net::SocketAddr;
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Weak};
use std::time::Duration;

use mio::{Interest, Token};
use rdma_types::{Guid, Qpn};

use crate::dev::{self, Origin};
use crate::{Shared, SoftIwarp};

/// The destination QPN of a QP whose stream comes from a CM.
pub const CM_QPN: Qpn = Qpn::from_bits(0);

/// Called (on the NIC's IO thread, no lock held) with the NIC's GUID and
/// the QP whose CM-made stream ended.
pub type ClosedHook = Arc<dyn Fn(Guid, Qpn) + Send + Sync>;

/// Takes a listener's requests (on the NIC's IO thread, no lock held; it
/// may answer them at once).
pub type RequestSink = Arc<dyn Fn(CmRequest) + Send + Sync>;

/// Why a CM operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    /// The peer's MPA reply rejected the request.
    #[error("the peer rejected the connection (private data {private_data:02x?})")]
    Rejected {
        /// The reject's private data.
        private_data: Vec<u8>,
    },
    /// The peer's TCP refused the connection: nothing listens there.
    #[error("TCP connection to {0} refused: nothing listens there")]
    Refused(SocketAddr),
    /// No reply within the time given.
    #[error("no MPA reply within the timeout")]
    TimedOut,
    /// The stream or the MPA exchange failed.
    #[error("the connection failed: {0}")]
    Failed(String),
    /// The NIC has no such QP.
    #[error("no QP {0} on this NIC")]
    NoSuchQp(u32),
    /// The QP is not in INIT, RTR or RTS, or has a stream already.
    #[error("QP {0} cannot take a stream (not INIT to RTS, or connected already)")]
    QpNotReady(u32),
    /// Private data too long for the frame.
    #[error("{0}")]
    PrivateData(String),
    /// The request's stream is gone (the peer left, or it was answered).
    #[error("the request is gone (peer closed, or answered already)")]
    Gone,
    /// The NIC is not open, or a socket call failed.
    #[error("{0}")]
    Io(String),
}

/// An MPA request a CM listener received.
#[derive(Debug)]
pub struct CmRequest {
    /// Our end of the stream.
    pub local: SocketAddr,
    /// The peer's end.
    pub peer: SocketAddr,
    /// The request's private data.
    pub private_data: Vec<u8>,
    /// The peer's IRD and ORD (MPA revision 2, RFC 6581).
    pub ird_ord: Option<(u16, u16)>,
    pub(crate) guid: Guid,
    pub(crate) tok: Token,
    pub(crate) shared: Weak<Shared>,
}

impl CmRequest {
    /// Accepts with QP `qpn` of the listening NIC and our private data;
    /// the QP's stream is this one from now on.
    ///
    /// # Errors
    /// No such QP, or not ready; the request gone; private data too long.
    pub fn accept(self, qpn: Qpn, private_data: &[u8]) -> Result<(), CmError> {
        let shared = self.shared.upgrade().ok_or(CmError::Gone)?;
        let now = shared.now();
        let mut st = shared.lock();
        let r = dev::cm_accept(
            &mut st,
            self.guid.0,
            self.tok,
            qpn.value(),
            private_data,
            now,
        );
        if let Some(d) = st.devs.get_mut(&self.guid.0) {
            d.kick();
        }
        r
    }

    /// Rejects with `private_data` (a reply with the R bit); the stream
    /// closes.
    pub fn reject(self, private_data: &[u8]) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let now = shared.now();
        let mut st = shared.lock();
        dev::cm_reject(&mut st, self.guid.0, self.tok, private_data, now);
        if let Some(d) = st.devs.get_mut(&self.guid.0) {
            d.kick();
        }
    }
}

/// A connect's outcome when the peer accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmConnected {
    /// The reply's private data.
    pub private_data: Vec<u8>,
    /// Negotiated RDMA Reads we serve at once.
    pub ird: u16,
    /// Negotiated RDMA Reads we issue at once.
    pub ord: u16,
    /// Our end of the stream.
    pub local: SocketAddr,
}

/// A CM listener: requests arrive on [`CmListener::requests`] (or at the
/// sink of [`SoftIwarp::cm_listen_with`]) until it is dropped.
pub struct CmListener {
    rx: Option<Receiver<CmRequest>>,
    guid: Guid,
    tok: Token,
    shared: Weak<Shared>,
    /// The address it listens on.
    pub local: SocketAddr,
}

impl CmListener {
    /// The requests (`None` for a listener with a sink of its own).
    pub fn requests(&self) -> Option<&Receiver<CmRequest>> {
        self.rx.as_ref()
    }
}

impl Drop for CmListener {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            let mut st = shared.lock();
            if let Some(d) = st.devs.get_mut(&self.guid.0) {
                d.remove_cm_listener(self.tok);
            }
        }
    }
}

impl SoftIwarp {
    /// Listens on TCP `port` of NIC `guid`'s address (the NIC must be
    /// open).
    ///
    /// # Errors
    /// The NIC is not open, or the port is taken.
    pub fn cm_listen(&self, guid: Guid, port: u16) -> Result<CmListener, CmError> {
        let (tx, rx) = channel();
        let sink: RequestSink = Arc::new(move |req: CmRequest| {
            // The listener was dropped: nobody answers, so refuse.
            if let Err(e) = tx.send(req) {
                e.0.reject(b"");
            }
        });
        let mut l = self.cm_listen_with(guid, port, sink)?;
        l.rx = Some(rx);
        Ok(l)
    }

    /// [`SoftIwarp::cm_listen`] handing each request to `sink`.
    ///
    /// # Errors
    /// As [`SoftIwarp::cm_listen`].
    pub fn cm_listen_with(
        &self,
        guid: Guid,
        port: u16,
        sink: RequestSink,
    ) -> Result<CmListener, CmError> {
        let mut st = self.shared.lock();
        let d = st
            .devs
            .get_mut(&guid.0)
            .ok_or_else(|| CmError::Io(format!("NIC {guid} is not open")))?;
        let at = SocketAddr::new(d.ip(), port);
        let mut l = mio::net::TcpListener::bind(at)
            .map_err(|e| CmError::Io(format!("cannot listen on {at}: {e}")))?;
        let tok = d.token();
        d.registry()
            .register(&mut l, tok, Interest::READABLE)
            .map_err(|e| CmError::Io(e.to_string()))?;
        d.cm_listeners.insert(tok, (l, sink));
        Ok(CmListener {
            rx: None,
            guid,
            tok,
            shared: Arc::downgrade(&self.shared),
            local: at,
        })
    }

    /// Connects QP `qpn` of NIC `guid` to a CM listener at `dst` with
    /// `private_data`; blocks until the MPA reply (the QP then has its
    /// stream), a reject, a failure, or `timeout`.
    ///
    /// # Errors
    /// [`CmError::Rejected`] with the reply's private data,
    /// [`CmError::TimedOut`], the QP not found or not ready, a failed
    /// stream.
    pub fn cm_connect(
        &self,
        guid: Guid,
        qpn: Qpn,
        dst: SocketAddr,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<CmConnected, CmError> {
        let (tx, rx) = channel();
        let tok = {
            let now = self.shared.now();
            let mut st = self.shared.lock();
            let i = dev::qp_for_cm(&mut st, guid.0, qpn.value())?;
            let ip = crate::ca_ip(self, guid.0).ok_or(CmError::Io("no such NIC".into()))?;
            let origin = Origin::CmConnect {
                qp: i,
                qpn: qpn.value(),
                waiter: Some(tx),
            };
            let tok = dev::connect(&mut st, guid.0, ip, dst, private_data.to_vec(), origin, now)
                .map_err(|e| CmError::Io(format!("cannot connect to {dst}: {e}")))?;
            dev::pump(&mut st, guid.0, tok, now);
            tok
        };
        match rx.recv_timeout(timeout) {
            Ok(r) => r,
            Err(_) => {
                let now = self.shared.now();
                let mut st = self.shared.lock();
                dev::cm_abandon(&mut st, guid.0, tok, now);
                // It may have been accepted just now.
                rx.try_recv().unwrap_or(Err(CmError::TimedOut))
            }
        }
    }

    /// Disconnects QP `qpn` of NIC `guid`: its stream closes (the peer
    /// sees it end) and the QP goes to ERR, its work flushed.
    ///
    /// # Errors
    /// No such QP.
    pub fn cm_disconnect(&self, guid: Guid, qpn: Qpn) -> Result<(), CmError> {
        let mut st = self.shared.lock();
        let i = st
            .devs
            .get(&guid.0)
            .and_then(|d| d.qpns.get(&qpn.value()).copied())
            .ok_or(CmError::NoSuchQp(qpn.value()))?;
        let q = st.qp_mut(i);
        if q.conn.is_some() && q.state != rdma_types::QpState::Reset {
            q.state = rdma_types::QpState::Err;
            dev::qp_error(&mut st, i);
        }
        if let Some(d) = st.devs.get_mut(&guid.0) {
            d.kick();
        }
        Ok(())
    }

    /// Runs `f` on NIC `guid`'s IO thread with no lock held (a CM's hooks
    /// that must not run inside the caller's call).
    pub fn cm_defer(&self, guid: Guid, f: Box<dyn FnOnce() + Send>) {
        let mut st = self.shared.lock();
        if let Some(d) = st.devs.get_mut(&guid.0) {
            d.defer(dev::Cb::Call(f));
            d.kick();
        }
    }

    /// Sets the hook told when a stream a CM made ends under its QP.
    pub fn cm_on_closed(&self, guid: Guid, hook: ClosedHook) {
        self.shared.lock().cm_closed.insert(guid.0, hook);
    }
}
