//! Shared ports: each soft RoCE NIC's UDP port is a
//! [`roce_udp::PortGroup`], so a client can run its own QPs' transport
//! on the NIC's address (the daemon lends it a member of the group and a
//! block of QP numbers; the kernel steers each datagram to the member of
//! its QP number's block). The daemon's node keeps member 0: QP1 (so
//! the CM, SA and DM stay the daemon's, [`crate::mads`]), the QPs of
//! clients that post through rings, and every block lent to nobody.
//!
//! A client whose QPs run in its own process posts and polls with no
//! hand-off to another process at all: the same path as a NIC of its own
//! ([`crate::client`]'s direct mode). The kernel's steering is what
//! keeps clients apart: a member receives only its block's datagrams,
//! and a peer's RDMA reaches only memory the member's owner registered
//! (its own engine checks every key).

use crate::server::PortLender;
use rdma_types::Guid;
use rnic::softroce::{SharedPort, SoftRoce};
use roce_udp::PortGroup;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use verbs::{Result, VerbsError};

/// The shared ports of a soft RoCE provider's NICs.
pub struct SharedPorts {
    soft: Arc<SoftRoce>,
    udp_port: u16,
    groups: Mutex<HashMap<Guid, PortGroup>>,
}

impl SharedPorts {
    /// None yet, for the NICs of `soft` on `udp_port`.
    pub fn new(soft: Arc<SoftRoce>, udp_port: u16) -> Arc<SharedPorts> {
        Arc::new(SharedPorts {
            soft,
            udp_port,
            groups: Mutex::new(HashMap::new()),
        })
    }

    /// Binds the port of the NIC at `ip` as a group and has the NIC's
    /// node use member 0; before the NIC's first open. Nothing when it is
    /// shared already.
    ///
    /// # Errors
    /// The port cannot be bound (in use, the address not local; kind
    /// `ResourceBusy` while clients of an earlier daemon still hold
    /// members of its group), or the NIC is open already.
    pub fn share(&self, ip: IpAddr) -> std::io::Result<()> {
        self.share_ca(rnic::softroce::ip_guid(ip), ip)
    }

    /// [`SharedPorts::share`] for the provider's CA `guid` at `ip` (a
    /// provider that names its CAs otherwise than by their addresses).
    ///
    /// # Errors
    /// As [`SharedPorts::share`]'s.
    pub fn share_ca(&self, guid: Guid, ip: IpAddr) -> std::io::Result<()> {
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        if groups.contains_key(&guid) {
            return Ok(());
        }
        let addr = SocketAddr::new(ip, self.udp_port);
        let g = PortGroup::bind(addr)
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot bind {addr}: {e}")))?;
        let owner = g.owner()?;
        let port = SharedPort {
            socket: Arc::new(owner),
            qpns: roce_udp::block_qpns(0),
        };
        self.soft
            .share_port(guid, Some(port))
            .map_err(|e| std::io::Error::other(format!("{addr}: {e}")))?;
        groups.insert(guid, g);
        Ok(())
    }

    /// Stops sharing the port of NIC `guid` (it would not open): its
    /// group is closed.
    pub fn unshare(&self, guid: Guid) {
        let _ = self.soft.share_port(guid, None);
        self.groups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&guid);
    }

    /// The blocks lent now of each shared port (0 among them).
    pub fn lent(&self) -> Vec<(Guid, Vec<u8>)> {
        let groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        groups.iter().map(|(g, p)| (*g, p.lent())).collect()
    }
}

impl PortLender for SharedPorts {
    fn lend(&self, guid: Guid) -> Result<(u8, OwnedFd)> {
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        let g = groups.get_mut(&guid).ok_or(VerbsError::NotSupported(
            "this NIC's port is not shared (an ib port): its QPs go through the daemon",
        ))?;
        g.lend()
            .map_err(|e| VerbsError::InvalidArgument(format!("{}: {e}", g.local_addr())))
    }

    fn give_back(&self, guid: Guid, block: u8) {
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = groups.get_mut(&guid) {
            if let Err(e) = g.give_back(block) {
                tracing::warn!(
                    "nicd: block {block} of {}: {e} (its datagrams stay unread)",
                    g.local_addr()
                );
            }
        }
    }
}
