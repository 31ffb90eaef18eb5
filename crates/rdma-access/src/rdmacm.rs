//! RDMA CM: IP-addressed connections over the IB CM, in Linux `rdma_cm`'s
//! layout (service ID from the TCP port space, `cma_hdr` in the private
//! data), so Linux peers can connect to us and we to them.

use crate::agent::{CmAgent, CmError, Established, Incoming, Path};
use rdma_cm::ConnId;
use rdma_mad::cm::{port_space, rdma_cm_service_id, CmaHdrRepr, CMA_HDR_LEN};
use rdma_types::{Gid, Guid, Pkey, PortNum, Psn, Qpn};
use std::borrow::Borrow;
use std::net::IpAddr;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Duration;

/// Why an address or a route did not resolve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// No port of the given CAs has the address's GID.
    #[error("no local RDMA device for address {0}")]
    NoDevice(IpAddr),
    /// No source address was named, and none of the CAs has the one the
    /// kernel would send from towards the destination.
    #[error(
        "no local RDMA device for {src}, the kernel's source address towards {dst}: name the source address"
    )]
    NoDeviceForRoute {
        /// The kernel's source address.
        src: IpAddr,
        /// The destination.
        dst: IpAddr,
    },
    /// The destination cannot be connected to from the source.
    #[error("cannot reach {dst} from {src}: {why}")]
    Unreachable {
        /// The source address (unspecified when none was named).
        src: IpAddr,
        /// The destination.
        dst: IpAddr,
        /// Why.
        why: String,
    },
    /// The route is asked of a CA other than the one the address
    /// resolved to.
    #[error("{src} is served by CA {resolved}, not by CA {asked}")]
    WrongDevice {
        /// The source address.
        src: IpAddr,
        /// The CA that serves it.
        resolved: Guid,
        /// The CA asked.
        asked: Guid,
    },
    /// The CA was removed.
    #[error("the CA serving {0} was removed")]
    DeviceRemoved(IpAddr),
}

/// What [`resolve_addr`] found, as librdmacm's `rdma_resolve_addr`
/// binds an id: the local CA and port that serve the source address,
/// and the GIDs of both ends (RoCEv2: an IPv4 address as the
/// IPv4-mapped GID `::ffff:a.b.c.d`, IPv6 as itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolved {
    /// The source address.
    pub src: IpAddr,
    /// The destination address.
    pub dst: IpAddr,
    /// The CA that serves `src`.
    pub ca: Guid,
    /// Its port.
    pub port: PortNum,
    /// The source GID.
    pub sgid: Gid,
    /// The source GID's index in the port's GID table.
    pub sgid_index: u8,
    /// The destination GID.
    pub dgid: Gid,
}

/// The port among `agents` whose GID table holds `ip`'s GID.
fn owner<A: Borrow<CmAgent>>(agents: &[A], ip: IpAddr) -> Option<(&CmAgent, u8)> {
    let gid = Gid::from_ip(ip);
    agents.iter().map(Borrow::borrow).find_map(|a: &CmAgent| {
        let i = a.gids().iter().position(|g| *g == gid)?;
        Some((a, u8::try_from(i).ok()?))
    })
}

/// The source address the kernel would use towards `dst` (a UDP socket
/// connected there: a route lookup, nothing is sent).
fn kernel_source(dst: IpAddr) -> std::io::Result<IpAddr> {
    let any: std::net::SocketAddr = if dst.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let s = std::net::UdpSocket::bind(any)?;
    s.connect((dst, 9))?;
    Ok(s.local_addr()?.ip())
}

/// Finds which of `agents`' ports (`Arc<CmAgent>`s or references)
/// serves a connection to `dst`, as
/// librdmacm's `rdma_resolve_addr`: the port that has `src`'s GID when a
/// source is named; without one, the port that has `dst`'s (a
/// connection to this host), else the one with the address the kernel
/// would send from towards `dst`.
///
/// # Errors
/// No port has the address ([`ResolveError::NoDevice`],
/// [`ResolveError::NoDeviceForRoute`]); a destination that cannot be
/// connected to (unspecified, multicast, another address family than
/// the source).
pub fn resolve_addr<A: Borrow<CmAgent>>(
    agents: &[A],
    dst: IpAddr,
    src: Option<IpAddr>,
) -> Result<Resolved, ResolveError> {
    let src = src.filter(|s| !s.is_unspecified());
    let unreachable = |why: &str| ResolveError::Unreachable {
        src: src.unwrap_or(if dst.is_ipv4() {
            std::net::Ipv4Addr::UNSPECIFIED.into()
        } else {
            std::net::Ipv6Addr::UNSPECIFIED.into()
        }),
        dst,
        why: why.into(),
    };
    if dst.is_unspecified() || dst.is_multicast() {
        return Err(unreachable("not a unicast address"));
    }
    if src.is_some_and(|s| s.is_ipv4() != dst.is_ipv4()) {
        return Err(unreachable("the addresses are of different families"));
    }
    let (agent, index, src) = match src {
        Some(s) => {
            let (a, i) = owner(agents, s).ok_or(ResolveError::NoDevice(s))?;
            (a, i, s)
        }
        None => match owner(agents, dst) {
            Some((a, i)) => (a, i, dst),
            None => {
                let s = kernel_source(dst).map_err(|e| unreachable(&e.to_string()))?;
                let (a, i) =
                    owner(agents, s).ok_or(ResolveError::NoDeviceForRoute { src: s, dst })?;
                (a, i, s)
            }
        },
    };
    if agent.is_removed() {
        return Err(ResolveError::DeviceRemoved(src));
    }
    Ok(Resolved {
        src,
        dst,
        ca: agent.ca_guid(),
        port: PortNum(1),
        sgid: Gid::from_ip(src),
        sgid_index: index,
        dgid: Gid::from_ip(dst),
    })
}

/// The path of a resolved address through `agent`'s port, as librdmacm's
/// `rdma_resolve_route` on RoCE (no SA to ask): the GIDs, the partition
/// of index 0 of the port's P_Key table, the port's active MTU, and the
/// agent's configured packet lifetime (Linux rdma_cm's 16 by default).
///
/// # Errors
/// `agent` is not the CA the address resolved to, or its CA is gone.
pub fn resolve_route(agent: &CmAgent, addr: &Resolved) -> Result<Path, ResolveError> {
    if agent.ca_guid() != addr.ca {
        return Err(ResolveError::WrongDevice {
            src: addr.src,
            resolved: addr.ca,
            asked: agent.ca_guid(),
        });
    }
    if agent.is_removed() {
        return Err(ResolveError::DeviceRemoved(addr.src));
    }
    Ok(Path {
        sgid: addr.sgid,
        ..agent.path_to(addr.dgid)
    })
}

/// The service ID of TCP port `port` in the RDMA CM port space.
pub fn service_id(port: u16) -> u64 {
    rdma_cm_service_id(port_space::TCP, port)
}

fn ip_bytes(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// A connection request with its IP addressing decoded.
pub struct Request {
    /// The IB CM request (accept / reject on it).
    pub incoming: Incoming,
    /// The requester's IP address and port.
    pub src: std::net::SocketAddr,
    /// The consumer's private data, after the `cma_hdr`.
    pub private_data: Vec<u8>,
}

/// Why a request was not an RDMA CM one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an RDMA CM request: {0}")]
pub struct BadRequest(pub String);

/// Decodes the `cma_hdr` of an incoming request.
pub fn decode(incoming: Incoming) -> Result<Request, (Incoming, BadRequest)> {
    let hdr = match CmaHdrRepr::parse(&incoming.private_data) {
        Ok(h) => h,
        Err(e) => return Err((incoming, BadRequest(e.to_string()))),
    };
    let ip = if hdr.ip_version == 4 {
        let b = &hdr.src_addr[12..16];
        IpAddr::from([b[0], b[1], b[2], b[3]])
    } else {
        IpAddr::from(hdr.src_addr)
    };
    let private_data = incoming.private_data[CMA_HDR_LEN..].to_vec();
    Ok(Request {
        src: std::net::SocketAddr::new(ip, hdr.src_port),
        private_data,
        incoming,
    })
}

/// Listens on TCP port `port` of the RDMA CM port space.
pub fn listen(agent: &CmAgent, port: u16) -> Receiver<Incoming> {
    agent.listen(service_id(port))
}

/// Connects from `src` to `dst:port` with `private_data` after the
/// `cma_hdr`: the addresses resolve ([`resolve_addr`], `src` must be
/// the agent's port's) to a route ([`resolve_route`]) whose GIDs,
/// MTU and packet lifetime the REQ carries. The REQ is in the
/// partition of index 0 of the port's P_Key table (on RoCE the default
/// P_Key, as Linux rdma_cm sends); see [`connect_in_partition`].
#[allow(clippy::too_many_arguments)]
pub fn connect(
    agent: &CmAgent,
    src: IpAddr,
    dst: IpAddr,
    port: u16,
    qpn: Qpn,
    psn: Psn,
    private_data: &[u8],
    timeout: Duration,
) -> Result<Established, CmError> {
    let pkey = agent.pkeys().first().copied().unwrap_or(Pkey::DEFAULT);
    connect_in_partition(agent, pkey, src, dst, port, qpn, psn, private_data, timeout)
}

/// [`connect`] for a QP at another P_Key index: the REQ carries `pkey`,
/// the P_Key of that index.
#[allow(clippy::too_many_arguments)]
pub fn connect_in_partition(
    agent: &CmAgent,
    pkey: Pkey,
    src: IpAddr,
    dst: IpAddr,
    port: u16,
    qpn: Qpn,
    psn: Psn,
    private_data: &[u8],
    timeout: Duration,
) -> Result<Established, CmError> {
    let hdr = CmaHdrRepr {
        cma_version: 0,
        ip_version: if dst.is_ipv4() { 4 } else { 6 },
        // The source port of an rdma_cm id; any ephemeral value.
        src_port: 0xc000 | (qpn.value() as u16 & 0x3fff),
        src_addr: ip_bytes(src),
        dst_addr: ip_bytes(dst),
    };
    let mut pd = vec![0u8; CMA_HDR_LEN];
    hdr.emit(&mut pd);
    pd.extend_from_slice(private_data);
    let path = resolve_route(agent, &resolve_addr(&[agent], dst, Some(src))?)?;
    let path = Path { pkey, ..path };
    agent.connect_path(&path, service_id(port), qpn, psn, pd, timeout)
}

/// How a consumer answers an [`IpRequest`]: the CM that delivered it
/// sends the REP or the REJ.
pub trait Answer: Send {
    /// A REP naming `qpn` (in RTR at least) whose receive queue starts at
    /// `psn`, carrying `private_data`; the READs offered are the
    /// request's [`IpRequest::initiator_depth`]. False when the request
    /// is no longer waiting (the requester gave up, the CA went).
    fn accept(self: Box<Self>, qpn: Qpn, psn: Psn, private_data: Vec<u8>) -> bool;
    /// A consumer-defined REJ carrying `private_data`.
    fn reject(self: Box<Self>, private_data: Vec<u8>);
}

/// An RDMA CM connection request as any [`Service`] delivers it: the
/// requester's address and QP, the consumer's private data (after the
/// `cma_hdr`), and what the REP may offer.
pub struct IpRequest {
    /// The connection, for [`Service::disconnect`] and the hooks.
    pub conn: ConnId,
    /// The requester's IP address and port.
    pub src: std::net::SocketAddr,
    /// The consumer's private data, after the `cma_hdr`.
    pub private_data: Vec<u8>,
    /// The requester's port GID.
    pub peer: Gid,
    /// The requester's QP.
    pub remote_qpn: Qpn,
    /// The first PSN the requester receives: this side's send PSN.
    pub remote_psn: Psn,
    /// The path MTU.
    pub mtu: rdma_types::Mtu,
    /// The request's partition.
    pub pkey: Pkey,
    /// RDMA READs this side may have outstanding at the requester: what
    /// [`QpParams::DEFAULT`](crate::QpParams::DEFAULT) offers, at most
    /// the request's responder resources.
    pub initiator_depth: u8,
    /// The local ACK timeout exponent the path gives this side's QP.
    pub ack_timeout: u8,
    /// The first PSN this side's QP must receive when the CM chose it
    /// (the kernel's CM on an rdma-core device announces its own in the REP); `None`:
    /// the consumer's choice, given to [`Answer::accept`].
    pub local_psn: Option<Psn>,
    /// Who sends the REP or the REJ (the CM that delivered the request).
    pub answer: Box<dyn Answer>,
}

impl std::fmt::Debug for IpRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpRequest")
            .field("conn", &self.conn)
            .field("src", &self.src)
            .field("remote_qpn", &self.remote_qpn)
            .finish()
    }
}

impl IpRequest {
    /// Accepts ([`Answer::accept`]).
    pub fn accept(self, qpn: Qpn, psn: Psn, private_data: Vec<u8>) -> bool {
        self.answer.accept(qpn, psn, private_data)
    }

    /// Rejects ([`Answer::reject`]).
    pub fn reject(self, private_data: Vec<u8>) {
        self.answer.reject(private_data)
    }
}

/// What a listener receives: a request, or one that was no RDMA CM
/// request at all (already refused with an empty REJ).
pub type Listened = Result<IpRequest, BadRequest>;

/// A hook called with a connection ([`Service::on_disconnect`],
/// [`Service::on_established`]).
pub type ConnHook = Arc<dyn Fn(ConnId) + Send + Sync>;

/// RDMA CM on one CA, whoever runs it: this crate's CM on the port's QP1
/// ([`CmAgent`]), or the kernel's (`rdmacore::RdmaCm`) on an rdma-core
/// device (the `rdmacore` crate). Consumers (the SRP target and
/// initiator) hold an `Arc<dyn Service>` and never know which.
pub trait Service: Send + Sync {
    /// Listens on TCP port `port` of the RDMA CM port space on this CA's
    /// addresses; requests arrive on the receiver until the service stops.
    ///
    /// # Errors
    /// The port is taken, or the CA is gone.
    fn listen(&self, port: u16) -> Result<Receiver<Listened>, CmError>;

    /// Connects from `src` (an address of this CA) to `dst` with the
    /// consumer's `private_data`, naming QP `qpn` whose receive queue
    /// starts at `psn` (unless the CM chooses: [`Established::local_psn`]);
    /// blocks until the REP (the connection is established, the RTU sent),
    /// a REJ, no answer, or `timeout`.
    ///
    /// # Errors
    /// [`CmError::Rejected`] with the REJ, [`CmError::TimedOut`], an
    /// address or route that does not resolve, the CA gone.
    fn connect(
        &self,
        src: IpAddr,
        dst: std::net::SocketAddr,
        qpn: Qpn,
        psn: Psn,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<Established, CmError>;

    /// Disconnects `conn` (DREQ), or refuses it while its REP waits for
    /// the RTU.
    fn disconnect(&self, conn: ConnId);

    /// [`Service::disconnect`], then waits up to `within` for the DREP.
    /// False if it did not come.
    fn disconnect_wait(&self, conn: ConnId, within: Duration) -> bool;

    /// Sets the hook called when the CM ends a connection (a DREQ, a REJ
    /// of the REP, no RTU, the CA gone).
    fn on_disconnect(&self, hook: ConnHook);

    /// Sets the hook called when an accepted connection's RTU arrives.
    fn on_established(&self, hook: ConnHook);
}

/// An [`Incoming`] answered through [`Answer`].
struct AgentAnswer(Incoming);

impl Answer for AgentAnswer {
    fn accept(self: Box<Self>, qpn: Qpn, psn: Psn, private_data: Vec<u8>) -> bool {
        self.0
            .accept_offering(qpn, psn, crate::QpParams::DEFAULT, private_data)
    }

    fn reject(self: Box<Self>, private_data: Vec<u8>) {
        self.0.reject(private_data);
    }
}

/// A REQ of `agent`'s listener as an [`IpRequest`]: its `cma_hdr`
/// decoded; one without a valid header refused with an empty REJ.
fn ip_request(inc: Incoming) -> Listened {
    match decode(inc) {
        Ok(r) => {
            let inc = r.incoming;
            Ok(IpRequest {
                conn: inc.conn,
                src: r.src,
                private_data: r.private_data,
                peer: inc.peer,
                remote_qpn: inc.remote_qpn,
                remote_psn: inc.remote_psn,
                mtu: inc.mtu,
                pkey: inc.pkey,
                initiator_depth: inc.negotiate(crate::QpParams::DEFAULT).initiator_depth,
                ack_timeout: inc.timing.local_ack_timeout().value(),
                local_psn: None,
                answer: Box::new(AgentAnswer(inc)),
            })
        }
        Err((inc, e)) => {
            inc.reject(Vec::new());
            Err(e)
        }
    }
}

impl Service for CmAgent {
    fn listen(&self, port: u16) -> Result<Receiver<Listened>, CmError> {
        if self.is_removed() {
            return Err(CmError::DeviceRemoved);
        }
        let requests = listen(self, port);
        let (tx, rx) = std::sync::mpsc::channel();
        // Decoding answers a bad REQ, so it runs apart from the agent's
        // thread; it ends with the listen.
        std::thread::Builder::new()
            .name(format!("rdmacm listen {port}"))
            .spawn(move || {
                while let Ok(inc) = requests.recv() {
                    if tx.send(ip_request(inc)).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| CmError::Mad(format!("start the listener thread: {e}")))?;
        Ok(rx)
    }

    fn connect(
        &self,
        src: IpAddr,
        dst: std::net::SocketAddr,
        qpn: Qpn,
        psn: Psn,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<Established, CmError> {
        connect(
            self,
            src,
            dst.ip(),
            dst.port(),
            qpn,
            psn,
            private_data,
            timeout,
        )
    }

    fn disconnect(&self, conn: ConnId) {
        CmAgent::disconnect(self, conn)
    }

    fn disconnect_wait(&self, conn: ConnId, within: Duration) -> bool {
        CmAgent::disconnect_wait(self, conn, within)
    }

    fn on_disconnect(&self, hook: ConnHook) {
        CmAgent::on_disconnect(self, move |c| hook(c))
    }

    fn on_established(&self, hook: ConnHook) {
        CmAgent::on_established(self, move |c| hook(c))
    }
}
