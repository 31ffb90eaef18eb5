//! Work queue entries as the engine sees them, and the completions it emits.

use rdma_types::{AccessFlags, Lkey, Qkey, Qpn, Rkey, WcOpcode, WcStatus};

/// A scatter/gather element: a range of registered local memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Virtual address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Local key of the region.
    pub lkey: Lkey,
}

/// A resolved datagram destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    /// Destination QP.
    pub qpn: Qpn,
    /// Q_Key to send with (already resolved against the QP's own Q_Key for
    /// controlled keys).
    pub qkey: Qkey,
    /// The driver's handle of the address (AH); opaque to the engine.
    pub ah: u32,
}

/// A memory window bind carried by the send queue (IBA 10.6.7.2.2): the
/// driver's numbers for the window and the region (opaque to the engine)
/// and what the window is to cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBindOp {
    /// The window, as the driver numbers it.
    pub mw: u32,
    /// The region the window lies in, as the driver numbers it.
    pub mr: u32,
    /// The R_Key the window gets (its low 8 bits are the consumer's).
    pub rkey: Rkey,
    /// First byte of the window (inside the region).
    pub addr: u64,
    /// Length of the window.
    pub len: u64,
    /// Remote rights the window grants.
    pub access: AccessFlags,
}

/// The operation of a send queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// SEND.
    Send,
    /// SEND with immediate.
    SendImm(u32),
    /// SEND with invalidate.
    SendInv(Rkey),
    /// RDMA WRITE.
    Write {
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: Rkey,
    },
    /// RDMA WRITE with immediate.
    WriteImm {
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: Rkey,
        /// Immediate data.
        imm: u32,
    },
    /// RDMA READ.
    Read {
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: Rkey,
    },
    /// Atomic compare and swap (8 bytes).
    CmpSwap {
        /// Remote address, 8-byte aligned.
        raddr: u64,
        /// Remote key.
        rkey: Rkey,
        /// Compare operand.
        compare: u64,
        /// Swap operand.
        swap: u64,
    },
    /// Atomic fetch and add (8 bytes).
    FetchAdd {
        /// Remote address, 8-byte aligned.
        raddr: u64,
        /// Remote key.
        rkey: Rkey,
        /// Addend.
        add: u64,
    },
    /// Bind a memory window: a local operation, executed when the send
    /// queue reaches it, in order with the entries around it.
    BindMw(MwBindOp),
    /// Local invalidate of an R_Key: a local operation like `BindMw`.
    LocalInv(Rkey),
}

impl SendOp {
    /// The completion opcode for this operation.
    pub fn wc_opcode(self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendImm(_) | SendOp::SendInv(_) => WcOpcode::Send,
            SendOp::Write { .. } | SendOp::WriteImm { .. } => WcOpcode::RdmaWrite,
            SendOp::Read { .. } => WcOpcode::RdmaRead,
            SendOp::CmpSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::BindMw(_) => WcOpcode::BindMw,
            SendOp::LocalInv(_) => WcOpcode::LocalInv,
        }
    }

    /// Whether the operation stays on this node (no packets, no PSNs).
    pub fn is_local(self) -> bool {
        matches!(self, SendOp::BindMw(_) | SendOp::LocalInv(_))
    }

    /// Whether the operation carries the message's bytes in its request
    /// packets (SENDs and RDMA WRITEs, with or without immediate or
    /// invalidate).
    pub fn is_send_or_write(self) -> bool {
        matches!(
            self,
            SendOp::Send
                | SendOp::SendImm(_)
                | SendOp::SendInv(_)
                | SendOp::Write { .. }
                | SendOp::WriteImm { .. }
        )
    }

    /// Whether the operation needs responder resources (READ, atomics).
    pub fn is_read_or_atomic(self) -> bool {
        matches!(
            self,
            SendOp::Read { .. } | SendOp::CmpSwap { .. } | SendOp::FetchAdd { .. }
        )
    }

    /// Whether the operation is an atomic.
    pub fn is_atomic(self) -> bool {
        matches!(self, SendOp::CmpSwap { .. } | SendOp::FetchAdd { .. })
    }
}

/// A send queue entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWqe {
    /// Consumer's work request ID.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// Local memory: the data to send, or where READ/atomic results land.
    pub sges: Vec<Sge>,
    /// Inline data, sent instead of `sges` (SEND/WRITE only).
    pub inline: Option<Vec<u8>>,
    /// Generate a completion on success.
    pub signaled: bool,
    /// Set the solicited event bit on the last packet.
    pub solicited: bool,
    /// Wait for earlier READs and atomics to complete first.
    pub fence: bool,
    /// Destination for UD.
    pub ud: Option<UdDest>,
}

impl SendWqe {
    /// A signaled entry with no flags.
    pub fn new(wr_id: u64, op: SendOp, sges: Vec<Sge>) -> Self {
        SendWqe {
            wr_id,
            op,
            sges,
            inline: None,
            signaled: true,
            solicited: false,
            fence: false,
            ud: None,
        }
    }

    /// Message length: the inline data or the sum of the SGEs.
    pub fn len(&self) -> u64 {
        match &self.inline {
            Some(d) => d.len() as u64,
            None => self.sges.iter().map(|s| u64::from(s.len)).sum(),
        }
    }

    /// Whether the message is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A receive queue entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWqe {
    /// Consumer's work request ID.
    pub wr_id: u64,
    /// Where incoming data lands.
    pub sges: Vec<Sge>,
}

impl RecvWqe {
    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.sges.iter().map(|s| u64::from(s.len)).sum()
    }
}

/// A work completion produced by the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// Consumer's work request ID.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// Operation.
    pub opcode: WcOpcode,
    /// Bytes transferred (receives: bytes placed, including a GRH).
    pub byte_len: u32,
    /// Immediate data received.
    pub imm: Option<u32>,
    /// R_Key invalidated by a SEND with invalidate.
    pub invalidated: Option<Rkey>,
    /// Source QP of a datagram.
    pub src_qp: Option<Qpn>,
    /// A GRH occupies the first 40 bytes of the receive buffer.
    pub grh: bool,
    /// Whether it is a receive-queue completion.
    pub is_recv: bool,
    /// The solicited bit was set on the message.
    pub solicited: bool,
}

impl Completion {
    pub(crate) fn send(wr_id: u64, op: SendOp, status: WcStatus, byte_len: u32) -> Self {
        Completion {
            wr_id,
            status,
            opcode: op.wc_opcode(),
            byte_len,
            imm: None,
            invalidated: None,
            src_qp: None,
            grh: false,
            is_recv: false,
            solicited: false,
        }
    }

    pub(crate) fn recv(wr_id: u64, status: WcStatus, opcode: WcOpcode, byte_len: u32) -> Self {
        Completion {
            wr_id,
            status,
            opcode,
            byte_len,
            imm: None,
            invalidated: None,
            src_qp: None,
            grh: false,
            is_recv: true,
            solicited: false,
        }
    }
}
