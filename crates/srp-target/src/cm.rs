//! The target's CM login service: SRP logins arriving as CM REQs on a port's
//! CM agent (RDMA CM on ib_srpt's `rdma_cm_port`, IB CM on its service ID)
//! go to a [`TargetPort`], and the connection's life and the channel's are
//! kept together both ways. What happens is told as [`LoginEvent`]s; the
//! daemon decides how to log them.

use crate::port::{CloseReason, ConnId, LocalQp, LoginOutcome, LoginRefusal, PeerQp, TargetPort};
use rdma_access::rdmacm::{Listened, Service};
use rdma_access::{CmAgent, Incoming, QpParams};
use rdma_types::{Lid, Pkey};
use srp::target::LoginForm;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Where a target takes logins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listen {
    /// RDMA CM port (ib_srpt's `rdma_cm_port`); the login follows the
    /// `cma_hdr` in the REQ (Linux ib_srp `dest=ip:port`).
    pub rdma_cm_port: Option<u16>,
    /// IB CM service ID (ib_srpt listens on its ioc_guid); the 64-byte
    /// login is the REQ private data (ib_srp `service_id=`).
    pub ib_service_id: Option<u64>,
}

/// Who ended a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClosedBy {
    /// The initiator, or its CM: a DREQ, a REJ of the REP, no RTU after
    /// every REP resend, the CA gone.
    Initiator,
    /// The target ([`CloseReason`] says why).
    Target,
}

impl ClosedBy {
    /// The word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            ClosedBy::Initiator => "initiator",
            ClosedBy::Target => "target",
        }
    }
}

/// Why a channel ended ([`LoginEvent::Closed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelEnd {
    /// The CM ended the connection that carried it: a DREQ, a REJ of the
    /// REP, no RTU after every REP resend, the CA gone.
    CmEnded,
    /// The target closed it, for this reason.
    Target(CloseReason),
}

impl ChannelEnd {
    /// Who ended the channel.
    pub fn by(&self) -> ClosedBy {
        match self {
            ChannelEnd::CmEnded => ClosedBy::Initiator,
            ChannelEnd::Target(_) => ClosedBy::Target,
        }
    }
}

impl std::fmt::Display for ChannelEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChannelEnd::CmEnded => f.write_str("the CM connection ended"),
            ChannelEnd::Target(why) => why.fmt(f),
        }
    }
}

/// What the login service did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoginEvent {
    /// A REQ that is no login at all (an RDMA CM REQ without a valid
    /// `cma_hdr`): refused with an empty REJ.
    RequestRefused {
        /// Why.
        error: rdma_access::rdmacm::BadRequest,
    },
    /// A listen could not start: logins there are not served (IB CM on
    /// a device whose kernel owns the CM).
    ListenFailed {
        /// Where (`RDMA CM port 5555`, `IB CM service ID ...`).
        what: String,
        /// Why, in words.
        error: String,
    },
    /// A login accepted: the REP went out.
    Accepted {
        /// Who asked (address or GID, and how).
        src: String,
        /// The REQ's partition.
        pkey: Pkey,
        /// The initiator's name (`0x` + its port identifier).
        initiator: Option<String>,
        /// The target's connection.
        conn: ConnId,
    },
    /// A login rejected: the REJ carries the SRP_LOGIN_REJ.
    Rejected {
        /// Who asked.
        src: String,
        /// The REQ's partition.
        pkey: Pkey,
        /// The initiator's name, when the login parsed.
        initiator: Option<String>,
        /// Why (its `Display` names the limit and its setting where one
        /// refused it).
        reason: LoginRefusal,
    },
    /// A channel ended.
    Closed {
        /// The target's connection.
        conn: ConnId,
        /// The initiator's name.
        initiator: String,
        /// Who ended it and why ([`ChannelEnd::by`]).
        reason: ChannelEnd,
    },
}

type Sink = Arc<dyn Fn(LoginEvent) + Send + Sync>;

/// A login a CM REQ carries, as [`Logins::request`] takes it.
#[derive(Debug, Clone)]
pub struct LoginRequest {
    /// The SRP_LOGIN_REQ: the REQ's private data (IB CM) or what follows
    /// its `cma_hdr` (RDMA CM).
    pub data: Vec<u8>,
    /// Which of the two.
    pub form: LoginForm,
    /// Who asks (address or GID, and how), for the events.
    pub src: String,
    /// The initiator's QP, with the READs the REP lets the target have
    /// outstanding at it.
    pub peer: PeerQp,
    /// The REQ's partition.
    pub pkey: Pkey,
}

/// What a REQ is answered with ([`Logins::request`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A REP naming the target's QP (already in RTS), the SRP_LOGIN_RSP
    /// as its private data.
    Accept {
        /// The target's QP.
        local: LocalQp,
        /// SRP_LOGIN_RSP bytes.
        rsp: Vec<u8>,
    },
    /// A REJ (consumer defined), the SRP_LOGIN_REJ as its private data.
    Reject {
        /// SRP_LOGIN_REJ bytes.
        rej: Vec<u8>,
    },
}

/// The login service's bookkeeping, apart from any CM: which CM
/// connection carries which of the target's channels, and what an event
/// at either end does at the other. [`serve`] runs it on a [`CmAgent`];
/// anything that routes a CM's events as the agent does
/// ([`rdma_access::hook_for`]) can run it as well (the `cm_login` fuzz
/// target does, on a sans-IO CM).
pub struct Logins {
    target: Arc<TargetPort>,
    events: Sink,
    /// CM connection -> the target's connection and its initiator's name.
    map: Mutex<HashMap<u32, (ConnId, String)>>,
}

impl Logins {
    /// Logins to `target`; what happens is told to `events`.
    ///
    /// # Locking
    ///
    /// `events` runs on the thread of the call that caused the event
    /// ([`Logins::request`], [`Logins::cm_ended`],
    /// [`Logins::target_closed`], the last from the port's disconnect
    /// hook) with no lock of the service or of the port held: it may call
    /// either.
    pub fn new(
        target: Arc<TargetPort>,
        events: impl Fn(LoginEvent) + Send + Sync + 'static,
    ) -> Logins {
        Logins::with_sink(target, Arc::new(events))
    }

    fn with_sink(target: Arc<TargetPort>, events: Sink) -> Logins {
        Logins {
            target,
            events,
            map: Mutex::default(),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<u32, (ConnId, String)>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A REQ on CM connection `cm`: its login goes to the target port in
    /// the REQ's partition (its P_Key picks the target QP's P_Key index; a
    /// partition the target does not serve is refused). `answer` sends
    /// the REP or the REJ; an accepted channel is carried by `cm` from
    /// before it is called. `answer` runs once, on this thread, before the
    /// event and with no lock of the service or of the port held.
    pub fn request(&self, cm: u32, req: LoginRequest, answer: impl FnOnce(Answer)) {
        let LoginRequest {
            data,
            form,
            src,
            peer,
            pkey,
        } = req;
        let initiator = match form {
            LoginForm::RdmaCm => srp::wire::LoginReq::parse_rdma(&data),
            LoginForm::IbCm => srp::wire::LoginReq::parse(&data),
        }
        .ok()
        .map(|r| crate::initiator_name(&r.initiator_port_id));
        match self.target.login_in_partition(&data, form, peer, pkey) {
            LoginOutcome::Accepted { conn, local, rsp } => {
                self.map()
                    .insert(cm, (conn, initiator.clone().unwrap_or_default()));
                answer(Answer::Accept { local, rsp });
                (self.events)(LoginEvent::Accepted {
                    src,
                    pkey,
                    initiator,
                    conn,
                });
            }
            LoginOutcome::Rejected { rej, reason } => {
                answer(Answer::Reject { rej });
                (self.events)(LoginEvent::Rejected {
                    src,
                    pkey,
                    initiator,
                    reason,
                });
            }
        }
    }

    /// The CM ended connection `cm` (a DREQ, a REJ of the REP, no RTU
    /// after every REP resend, the CA gone): its channel goes.
    pub fn cm_ended(&self, cm: u32) {
        let carried = self.map().remove(&cm);
        if let Some((conn, initiator)) = carried {
            self.target.disconnected(conn);
            (self.events)(LoginEvent::Closed {
                conn,
                initiator,
                reason: ChannelEnd::CmEnded,
            });
        }
    }

    /// The CM established connection `cm` (its RTU came): its login is
    /// no longer pending.
    pub fn cm_established(&self, cm: u32) {
        let conn = self.map().get(&cm).map(|c| c.0);
        if let Some(conn) = conn {
            self.target.established(conn);
        }
    }

    /// The target closed `conn` for `why`: the CM connection that carried
    /// it, for the CM to disconnect (or, while its login waits for the
    /// RTU, refuse); `None` if none did.
    pub fn target_closed(&self, conn: ConnId, why: &CloseReason) -> Option<u32> {
        let hit = {
            let mut map = self.map();
            let cm = map.iter().find(|(_, c)| c.0 == conn).map(|(cm, _)| *cm);
            cm.and_then(|cm| map.remove_entry(&cm))
        };
        let (cm, (_, initiator)) = hit?;
        (self.events)(LoginEvent::Closed {
            conn,
            initiator,
            reason: ChannelEnd::Target(why.clone()),
        });
        Some(cm)
    }

    /// The channels the service holds, each with the CM connection that
    /// carries it, by CM connection.
    pub fn carried(&self) -> Vec<(u32, ConnId)> {
        let mut v: Vec<(u32, ConnId)> = self.map().iter().map(|(cm, c)| (*cm, c.0)).collect();
        v.sort_unstable();
        v
    }
}

/// The I/O controller an SRP target port offers to device management
/// discovery (`rdma_access::dm::Ioc::srp`), named after its GUID.
pub fn ioc(guid: rdma_types::Guid, limits: &rdma_access::dm::IocLimits) -> rdma_access::dm::Ioc {
    rdma_access::dm::Ioc::srp(
        guid,
        limits,
        &format!("rdma-storage SRP target {:016x}", guid.0),
    )
}

/// Serves SRP logins for `target` on `agent` until the agent stops: RDMA
/// CM and IB CM both through this CA's own CM agent ([`serve_cm`]).
///
/// # Errors
/// As [`serve_cm`].
pub fn serve(
    agent: Arc<CmAgent>,
    target: Arc<TargetPort>,
    listen: Listen,
    events: impl Fn(LoginEvent) + Send + Sync + 'static,
) -> Result<Vec<JoinHandle<()>>, rdma_access::CmError> {
    serve_cm(agent.clone(), Some(agent), target, listen, events)
}

/// Serves SRP logins for `target` until the CM stops: RDMA CM logins
/// through `rdma_cm` (this CA's own CM agent, or the kernel's CM through
/// `rdmacore::RdmaCm` on an rdma-core device), IB CM logins through `ib_cm`, this
/// CA's own CM agent, the same that serves `rdma_cm` (`None` on a device
/// whose kernel owns the CM: then `listen.ib_service_id` is not served,
/// and a [`LoginEvent::ListenFailed`] says so). Each REQ's login goes to the target port
/// ([`Logins::request`]); the REP carries the SRP_LOGIN_RSP and offers no
/// more RDMA READs than the REQ takes, the REJ carries the SRP_LOGIN_REJ.
/// Disconnects travel both ways: every way the CM ends a connection (a
/// DREQ, a REJ of the REP, no RTU, the CA gone) releases the channel, and
/// a channel the target closes is disconnected (or, while its login waits
/// for the RTU, refused). Returns the threads taking the requests.
///
/// `events` runs as [`Logins::new`] says: on the thread that took the REQ,
/// the CM's thread (the CM ended a connection) or the port's (the target
/// closed a channel), with no lock of the service, the port or the CM
/// held. Serving sets the CM's `on_disconnect` and `on_established`
/// hooks and the port's `on_disconnect` hook.
///
/// # Errors
/// The RDMA CM listen failed (the port is taken on one of the CA's
/// addresses, the CA is gone): nothing serves then.
pub fn serve_cm(
    rdma_cm: Arc<dyn Service>,
    ib_cm: Option<Arc<CmAgent>>,
    target: Arc<TargetPort>,
    listen: Listen,
    events: impl Fn(LoginEvent) + Send + Sync + 'static,
) -> Result<Vec<JoinHandle<()>>, rdma_access::CmError> {
    let events: Sink = Arc::new(events);
    let logins = Arc::new(Logins::with_sink(target.clone(), events.clone()));
    {
        let logins = logins.clone();
        rdma_cm.on_disconnect(Arc::new(move |cm| logins.cm_ended(cm.0)));
    }
    {
        let logins = logins.clone();
        rdma_cm.on_established(Arc::new(move |cm| logins.cm_established(cm.0)));
    }
    {
        let (logins, cm) = (logins.clone(), rdma_cm.clone());
        target.on_disconnect(move |conn, why: &CloseReason| {
            if let Some(c) = logins.target_closed(conn, why) {
                cm.disconnect(rdma_access::ConnId(c));
            }
        });
    }
    let mut threads = Vec::new();
    if let Some(port) = listen.rdma_cm_port {
        let requests = rdma_cm.listen(port)?;
        let (logins, events) = (logins.clone(), events.clone());
        threads.push(std::thread::spawn(move || {
            while let Ok(req) = requests.recv() {
                login_ip(&logins, &events, req);
            }
        }));
    }
    if let Some(sid) = listen.ib_service_id {
        match ib_cm {
            Some(agent) => {
                let requests = agent.listen(sid);
                let logins = logins.clone();
                threads.push(std::thread::spawn(move || {
                    while let Ok(inc) = requests.recv() {
                        login_ib(&logins, inc);
                    }
                }));
            }
            None => events(LoginEvent::ListenFailed {
                what: format!("IB CM service ID {sid:016x}"),
                error: "this device's kernel owns its CM, and IB CM logins through it are not \
                        served yet: log in by RDMA CM (ib_srp dest=ip:port)"
                    .into(),
            }),
        }
    }
    Ok(threads)
}

/// An RDMA CM REQ (its `cma_hdr` already decoded): the login it
/// carries, answered.
fn login_ip(logins: &Logins, events: &Sink, req: Listened) {
    let req = match req {
        Ok(r) => r,
        Err(error) => return events(LoginEvent::RequestRefused { error }),
    };
    let login = LoginRequest {
        data: req.private_data.clone(),
        form: LoginForm::RdmaCm,
        src: req.src.to_string(),
        peer: PeerQp {
            qpn: req.remote_qpn,
            psn: req.remote_psn,
            gid: req.peer,
            lid: Lid(0),
            mtu: req.mtu,
            initiator_depth: req.initiator_depth,
            ack_timeout: req.ack_timeout,
            local_psn: req.local_psn,
        },
        pkey: req.pkey,
    };
    logins.request(req.conn.0, login, |answer| match answer {
        Answer::Accept { local, rsp } => {
            req.accept(local.qpn, local.psn, rsp);
        }
        Answer::Reject { rej } => req.reject(rej),
    });
}

/// An IB CM REQ: the login it carries, answered.
fn login_ib(logins: &Logins, inc: Incoming) {
    // The login is the REQ's private data itself.
    let data = inc.private_data.clone();
    let src = format!("GID {} (IB CM)", inc.peer);
    // READs outstanding at the initiator: no more than its REQ takes (the
    // REP says the same).
    let offer = inc.negotiate(QpParams::DEFAULT);
    let req = LoginRequest {
        data,
        form: LoginForm::IbCm,
        src,
        peer: PeerQp {
            qpn: inc.remote_qpn,
            psn: inc.remote_psn,
            gid: inc.peer,
            lid: Lid(0),
            mtu: inc.mtu,
            initiator_depth: offer.initiator_depth,
            ack_timeout: inc.timing.local_ack_timeout().value(),
            local_psn: None,
        },
        // The session is in the REQ's partition (the CM agent only
        // delivers REQs its port's P_Key table matches).
        pkey: inc.pkey,
    };
    logins.request(inc.conn.0, req, |answer| match answer {
        Answer::Accept { local, rsp } => {
            inc.accept_offering(local.qpn, local.psn, QpParams::DEFAULT, rsp);
        }
        Answer::Reject { rej } => {
            inc.reject(rej);
        }
    });
}
