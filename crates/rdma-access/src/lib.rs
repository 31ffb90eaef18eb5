//! The access layer's connection services over a verbs provider.
//!
//! [`CmAgent`] is a port's MAD driver and its IB connection manager: it
//! owns the port's special QPs (QP1, and QP0 where the provider has one),
//! their receive buffers and a thread with the clock, and runs the
//! port's MAD dispatcher ([`gsi`]) with the CM as one agent of it (CM
//! MADs in the `rdma-mad` formats, the `rdma-cm` state machines with
//! response timeouts, retries, timewait). Consumers listen on a service ID and get
//! [`Incoming`] requests to accept (with their QP and REP private data) or
//! reject (consumer defined, with private data), or connect to a service
//! at a peer GID and block until the REP, REJ or the last retry. A REQ
//! carries the partition key of the requester's QP (index 0 of the
//! port's table unless the consumer names another); the passive agent
//! delivers it in [`Incoming::pkey`] for the consumer's QP to take the
//! matching index, and refuses a REQ whose partition its port's P_Key
//! table lacks (REJ 12, as Linux ib_cm does).
//!
//! [`rdmacm`] puts IP addressing on top, as Linux `rdma_cm` lays it out:
//! the service ID of TCP port `p` is `0x0000000001060000 | p`, and the REQ
//! private data starts with the 36-byte `cma_hdr` (version, IP version,
//! source port, source and destination addresses) before the consumer's.
//! Its steps are librdmacm's: [`rdmacm::resolve_addr`] finds the local
//! port that has the source address (or serves the destination) and the
//! GIDs of both ends (on RoCEv2 an IPv4 address is the IPv4-mapped GID),
//! [`rdmacm::resolve_route`] the path through that port (GIDs, P_Key,
//! MTU, packet lifetime: on RoCE no SA is asked), and
//! [`rdmacm::connect`] goes through both before the REQ.
//!
//! [`gsi`] is the dispatcher, sans-IO: agents ([`CmAgent::mad_agent`])
//! register a class, version and methods; requests get transaction IDs
//! (agent number in the high half), time out and are resent; responses
//! find their requester by transaction ID; requests nobody serves get the
//! IBA status reply; RMPP responses are reassembled and acknowledged, and
//! large responses sent segmented. [`dm`] is the device management agent
//! an SRP target registers its I/O controller with, and the discovery walk
//! (`srp_daemon`'s) an initiator runs against it. [`sa`] is the subnet
//! administration client (paths, nodes, port infos by capability mask,
//! services, InformInfo subscriptions with their notices).
//!
//! [`resource`] is the layer consumers hold objects through: a tree per
//! client (CA, PD, CQ, SRQ, QP, MR, MW, AH, and tracked upper-layer
//! objects) torn down in dependency order when the client goes or its CA
//! is removed, live counters to prove nothing leaks, and plug-and-play
//! registration. [`sma`] answers a port's SMPs for the managed-subnet mode,
//! [`sma_agent`] runs it on a port's QP0, and [`ib_node`] ([`IbNode`]) is
//! a node's `ib` port: MAD driver and SMA, driving the port only through
//! the verbs' port control (`Provider::modify_port`).
//! [`devinfo`] is what `ibstat` lists of a CA and its ports.
//! [`multi::Providers`] holds several providers as one (our soft RoCE
//! NIC beside rdma-core devices), each call routed to the provider whose
//! CA it names.
//!
//! QP state transitions are the consumer's (its QP in RTR before it
//! accepts, moved to RTS on the answer) unless it hands the QP to the CM,
//! as Linux `rdma_connect` / `rdma_accept` with a QP: [`CmAgent::connect_qp`]
//! and [`Incoming::accept_qp`] take a [`ConnQp`] to INIT, RTR and RTS with
//! the values both sides' REQ and REP negotiated (QPNs, PSNs, path MTU,
//! READs each way, retry counts, the path's ACK timeout), and refuse the
//! connection with a REJ when a transition fails. The CM's waits come
//! from the [`Path`] (its packet lifetime) and the REQ's CM response
//! timeouts. What it leaves to the consumer: which port to use (one agent
//! per port). What it refuses: MADs that do
//! not parse (dropped), requests for services nobody listens on (REJ,
//! invalid service ID).

#![forbid(unsafe_code)]

mod agent;
pub mod devinfo;
pub mod dm;
pub mod gsi;
pub mod ib_node;
pub mod multi;
pub mod rdmacm;
pub mod resource;
pub mod retries;
pub mod sa;
pub mod sma;
pub mod sma_agent;
pub mod subnet;
mod wire;

pub use agent::{
    hook_for, recv_ring, recv_wr, send_ring, source_gid, special_qp, ud_grh, Call, CmAgent,
    CmError, ConnQp, Established, Incoming, MadAgent, MadAgentCloser, MadWait, Path, QpParams,
    Removed, RtuFault,
};
pub use ib_node::{IbNode, IbNodeError};
pub use rdma_cm::{CmConfig, ConnId, Timing};
