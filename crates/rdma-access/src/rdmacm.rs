//! RDMA CM: IP-addressed connections over the IB CM, in Linux `rdma_cm`'s
//! layout (service ID from the TCP port space, `cma_hdr` in the private
//! data), so Linux peers can connect to us and we to them.

use crate::agent::{CmAgent, CmError, Established, Incoming};
use rdma_mad::cm::{port_space, rdma_cm_service_id, CmaHdrRepr, CMA_HDR_LEN};
use rdma_types::{Gid, Pkey, Psn, Qpn};
use std::net::IpAddr;
use std::sync::mpsc::Receiver;
use std::time::Duration;

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
/// `cma_hdr`; the peer is reached at the GID of `dst`. The REQ is in the
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
    let (peer, sid) = (Gid::from_ip(dst), service_id(port));
    agent.connect_in_partition(peer, pkey, sid, qpn, psn, pd, timeout)
}
