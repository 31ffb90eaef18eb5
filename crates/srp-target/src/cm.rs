//! The target's CM login service: SRP logins arriving as CM REQs on a port's
//! CM agent (RDMA CM on ib_srpt's `rdma_cm_port`, IB CM on its service ID)
//! go to a [`TargetPort`], and the connection's life and the channel's are
//! kept together both ways. What happens is told as [`LoginEvent`]s; the
//! daemon decides how to log them.

use crate::port::{CloseReason, ConnId, LoginOutcome, PeerQp, TargetPort};
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

/// What the login service did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoginEvent {
    /// A REQ that is no login at all (an RDMA CM REQ without a valid
    /// `cma_hdr`): refused with an empty REJ.
    RequestRefused {
        /// Why.
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
        /// Why, naming the limit and its setting where one refused it.
        reason: String,
    },
    /// A channel ended.
    Closed {
        /// The target's connection.
        conn: ConnId,
        /// The initiator's name.
        initiator: String,
        /// Who ended it.
        by: ClosedBy,
        /// Why, in words.
        reason: String,
    },
}

type Sink = Arc<dyn Fn(LoginEvent) + Send + Sync>;

/// CM connection -> the target's connection and its initiator's name.
type Map = Arc<Mutex<HashMap<u32, (ConnId, String)>>>;

/// Serves SRP logins for `target` on `agent` until the agent stops: each
/// REQ's login goes to the target port in the REQ's partition (its P_Key
/// picks the target QP's P_Key index; a partition the target does not
/// serve is refused); the REP carries the SRP_LOGIN_RSP and offers no more
/// RDMA READs than the REQ takes, the REJ carries the SRP_LOGIN_REJ.
/// Disconnects travel both ways: every way the CM ends a connection
/// (a DREQ, a REJ of the REP, no RTU, the CA gone) releases the channel,
/// and a channel the target closes is disconnected (or, while its login
/// waits for the RTU, refused). Returns the threads taking the requests.
pub fn serve(
    agent: Arc<CmAgent>,
    target: Arc<TargetPort>,
    listen: Listen,
    events: impl Fn(LoginEvent) + Send + Sync + 'static,
) -> Vec<JoinHandle<()>> {
    let events: Sink = Arc::new(events);
    let map: Map = Arc::default();
    {
        let (map, target, events) = (map.clone(), target.clone(), events.clone());
        agent.on_disconnect(move |cm| {
            let conn = map.lock().unwrap_or_else(|e| e.into_inner()).remove(&cm.0);
            if let Some((conn, initiator)) = conn {
                target.disconnected(conn);
                events(LoginEvent::Closed {
                    conn,
                    initiator,
                    by: ClosedBy::Initiator,
                    reason: "the CM connection ended".into(),
                });
            }
        });
    }
    {
        let (map, target) = (map.clone(), target.clone());
        agent.on_established(move |cm| {
            let conn = map
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&cm.0)
                .map(|c| c.0);
            if let Some(conn) = conn {
                target.established(conn);
            }
        });
    }
    {
        let (map, agent, events) = (map.clone(), agent.clone(), events.clone());
        target.on_disconnect(move |conn, why: &CloseReason| {
            let hit = {
                let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
                let cm = map.iter().find(|(_, c)| c.0 == conn).map(|(cm, _)| *cm);
                cm.and_then(|cm| map.remove_entry(&cm))
            };
            if let Some((cm, (_, initiator))) = hit {
                events(LoginEvent::Closed {
                    conn,
                    initiator,
                    by: ClosedBy::Target,
                    reason: why.to_string(),
                });
                agent.disconnect(rdma_access::ConnId(cm));
            }
        });
    }
    let mut threads = Vec::new();
    let mut serve_form = |requests: std::sync::mpsc::Receiver<Incoming>, form: LoginForm| {
        let (map, target, events) = (map.clone(), target.clone(), events.clone());
        threads.push(std::thread::spawn(move || {
            while let Ok(inc) = requests.recv() {
                login(&map, &target, &events, inc, form);
            }
        }));
    };
    if let Some(port) = listen.rdma_cm_port {
        serve_form(rdma_access::rdmacm::listen(&agent, port), LoginForm::RdmaCm);
    }
    if let Some(sid) = listen.ib_service_id {
        serve_form(agent.listen(sid), LoginForm::IbCm);
    }
    threads
}

/// One REQ: the login it carries, answered.
fn login(map: &Map, target: &TargetPort, events: &Sink, inc: Incoming, form: LoginForm) {
    // RDMA CM: the login follows the cma_hdr; IB CM: it is the private
    // data itself.
    let (inc, data, src) = match form {
        LoginForm::RdmaCm => match rdma_access::rdmacm::decode(inc) {
            Ok(r) => (r.incoming, r.private_data, r.src.to_string()),
            Err((inc, e)) => {
                events(LoginEvent::RequestRefused {
                    error: e.to_string(),
                });
                inc.reject(Vec::new());
                return;
            }
        },
        LoginForm::IbCm => {
            let data = inc.private_data.clone();
            let src = format!("GID {} (IB CM)", inc.peer);
            (inc, data, src)
        }
    };
    // READs outstanding at the initiator: no more than its REQ takes (the
    // REP says the same).
    let offer = inc.negotiate(QpParams::DEFAULT);
    let peer = PeerQp {
        qpn: inc.remote_qpn,
        psn: inc.remote_psn,
        gid: inc.peer,
        lid: Lid(0),
        mtu: inc.mtu,
        initiator_depth: offer.initiator_depth,
        ack_timeout: inc.timing.local_ack_timeout().value(),
    };
    // The session is in the REQ's partition (the CM agent only delivers
    // REQs its port's P_Key table matches).
    let pkey = inc.pkey;
    let initiator = match form {
        LoginForm::RdmaCm => srp::wire::LoginReq::parse_rdma(&data),
        LoginForm::IbCm => srp::wire::LoginReq::parse(&data),
    }
    .ok()
    .map(|r| crate::initiator_name(&r.initiator_port_id));
    match target.login_in_partition(&data, form, peer, pkey) {
        LoginOutcome::Accepted { conn, local, rsp } => {
            map.lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(inc.conn.0, (conn, initiator.clone().unwrap_or_default()));
            inc.accept_offering(local.qpn, local.psn, QpParams::DEFAULT, rsp);
            events(LoginEvent::Accepted {
                src,
                pkey,
                initiator,
                conn,
            });
        }
        LoginOutcome::Rejected { rej, reason } => {
            inc.reject(rej);
            events(LoginEvent::Rejected {
                src,
                pkey,
                initiator,
                reason,
            });
        }
    }
}
