//! The data plane of the soft RoCE NIC: every QP engine of one node behind
//! one UDP socket.
//!
//! A [`Node`] owns a [`roce_udp::RoceSocket`] bound to the node's address
//! and a table of [`roce::Qp`] engines. [`Node::poll`] does a bounded round
//! of work: receive a batch of datagrams, check each ICRC (recovering the
//! IPv4 Identification a Linux sender chose, see `INTEROP.md`), hand the
//! packet to the QP its BTH names; then drain each QP's packets into RoCEv2
//! datagrams (ICRC computed for IPv4 ID 0, which our socket options make
//! the kernel send) and send them in one batch, each datagram as pieces the
//! kernel gathers: headers, the payload -- the registered memory itself
//! when the engine lent it (`roce::Payload::Pinned`: the kernel's copy is
//! the only one; the packet holds the region's allocation until sent, so
//! a deregistration meanwhile frees nothing it reads), else a buffer the
//! engine filled, given back for reuse once sent -- pad and ICRC;
//! runs of equal-size packets to one peer as one segmented (GSO) send
//! whose segment `k` carries the ICRC for IPv4 ID `k`, as the kernel
//! numbers them; then fire due timers.
//! A receive buffer the kernel coalesced (GRO) is checked segment by
//! segment with that numbering first. `NodeConfig::gso`/`gro` turn the
//! offloads off (binaries map `SOFTROCE_GSO=0` onto them with
//! [`gso_from_env`]; the library reads no environment variable).
//!
//! It is still a library piece, not a verbs provider: memory is reached
//! through the [`roce::Memory`] object each QP is created with, completions
//! and events are drained per QP, and the caller decides threads and
//! clocks. The verbs provider (`rnic`) wraps a node in a [`Driver`]: a
//! thread that receives and keeps the timers, while posting threads send
//! what they post themselves and a consumer waiting for its completions
//! may receive in the thread's place ([`Driver::drive`]); the node's lock
//! is never held across a system call (but a capture's file writes).
//!
//! Optional per node: a pcap file of every packet sent and received (with
//! IP and UDP headers, as Wireshark wants), and a seeded fault injector on
//! the send path (loss, duplication, reordering, corruption, link down).
//!
//! What it refuses: packets whose ICRC does not verify (dropped and
//! counted), packets for QPs it does not have (dropped and counted),
//! packets of a partition the port's P_Key table or the QP does not hold
//! (dropped, counted, the latest kept for a trap: [`Node::set_pkeys`];
//! the table is the default P_Key alone until set, so RoCE peers, which
//! send 0xFFFF as Linux rxe does, pass), and
//! blocking: nothing here sleeps except [`Node::wait`] and the [`Driver`]
//! thread, which runs a node's event loop for a consumer that wants CQ
//! callbacks and blocking waits.
//!
//! [`link`] follows the interface under a node's address (carrier and
//! administrative state, by rtnetlink), so a provider can take its port
//! down when the link goes, as Linux rxe does for its netdev (whether it
//! does is the provider's choice: `rnic` has an option for it).

#![deny(clippy::undocumented_unsafe_blocks)]

mod driver;
pub mod link;
mod node;

pub use driver::{CompletionCallback, Driver, Fed, Feeder, FeederId, Released, FEED_RETRY};
pub use node::{gso_from_env, gso_from_var, AhId, Node, NodeConfig, NodeStats, QpHandle, GSO_ENV};
pub use rdma_types::PkeyViolation;
pub use roce::FlatMemory;
