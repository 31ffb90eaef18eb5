//! Between the verbs types and libibverbs' values: one place per fact
//! (status, opcode, state, flags, attribute masks, errno).

use crate::sys::raw::{self, ibv_ah_attr, ibv_gid, ibv_global_route, ibv_qp_attr, ibv_wc};
use crate::sys::Errno;
use rdma_types::{Lid, Mtu, QpState, QpType, Qpn, Rkey, WcOpcode, WcStatus};
use verbs::{AhAttr, QpAttr, SendFlags, SendOpcode, VerbsError, WcFlags, WorkCompletion};

/// `enum ibv_wc_status`; our numbering is libibverbs' (0..=21), anything
/// newer (tag matching) is a general error.
pub(crate) fn wc_status(s: u32) -> WcStatus {
    WcStatus::from_code(s).unwrap_or(WcStatus::GeneralErr)
}

/// `enum ibv_wc_opcode` (an error completion's opcode is not defined by
/// the verbs; drivers set it anyway, and an unknown one reads as SEND).
pub(crate) fn wc_opcode(op: u32) -> WcOpcode {
    use raw::wc_opcode::*;
    match op {
        RDMA_WRITE => WcOpcode::RdmaWrite,
        RDMA_READ => WcOpcode::RdmaRead,
        COMP_SWAP => WcOpcode::CompSwap,
        FETCH_ADD => WcOpcode::FetchAdd,
        BIND_MW => WcOpcode::BindMw,
        LOCAL_INV => WcOpcode::LocalInv,
        RECV => WcOpcode::Recv,
        RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        _ => WcOpcode::Send,
    }
}

/// The `wc_flags` bit a device sets for a receive that invalidated an
/// R_Key: libibverbs' `IBV_WC_WITH_INV`, except on Linux rxe (vendor id
/// 0xffffff, as SPDK tells it), whose kernel driver writes its own
/// `IB_WC_WITH_INVALIDATE` (bit 2, `IBV_WC_IP_CSUM_OK` to libibverbs,
/// which rxe never sets) into the completions user space reads.
pub(crate) fn with_inv_flag(vendor_id: u32) -> u32 {
    const RXE_VENDOR_ID: u32 = 0xff_ffff;
    const RXE_WITH_INVALIDATE: u32 = 1 << 2;
    if vendor_id == RXE_VENDOR_ID {
        RXE_WITH_INVALIDATE
    } else {
        raw::IBV_WC_WITH_INV
    }
}

/// A work completion from the device's, with the consumer context of
/// its QP; `with_inv` is the device's invalidation bit ([`with_inv_flag`]).
pub(crate) fn work_completion(w: &ibv_wc, qp_ctx: u64, with_inv: u32) -> WorkCompletion {
    let mut wc = WorkCompletion::new(w.wr_id, wc_status(w.status), wc_opcode(w.opcode), qp_ctx);
    wc.byte_len = w.byte_len;
    if w.wc_flags & raw::IBV_WC_WITH_IMM != 0 {
        // Network order in the CQE, as it was on the wire.
        wc.imm = u32::from_be(w.imm_or_inv);
        wc.wc_flags = wc.wc_flags | WcFlags::WITH_IMM;
    }
    if w.wc_flags & with_inv != 0 {
        wc.invalidated_rkey = Rkey(w.imm_or_inv);
        wc.wc_flags = wc.wc_flags | WcFlags::WITH_INV;
    }
    if w.wc_flags & raw::IBV_WC_GRH != 0 {
        wc.wc_flags = wc.wc_flags | WcFlags::GRH;
    }
    wc.src_qp = Qpn::from_bits(w.src_qp);
    wc.pkey_index = w.pkey_index;
    wc.slid = Lid(w.slid);
    wc
}

/// `enum ibv_qp_state`.
pub(crate) fn qp_state_raw(s: QpState) -> u32 {
    use raw::qp_state::*;
    match s {
        QpState::Reset => RESET,
        QpState::Init => INIT,
        QpState::Rtr => RTR,
        QpState::Rts => RTS,
        QpState::Sqd => SQD,
        QpState::Sqe => SQE,
        QpState::Err => ERR,
    }
}

/// A state the device reports (an unknown one reads as ERR).
pub(crate) fn qp_state(s: u32) -> QpState {
    use raw::qp_state::*;
    match s {
        RESET => QpState::Reset,
        INIT => QpState::Init,
        RTR => QpState::Rtr,
        RTS => QpState::Rts,
        SQD => QpState::Sqd,
        SQE => QpState::Sqe,
        _ => QpState::Err,
    }
}

/// `enum ibv_qp_type` of the types a process may create; QP0 and QP1
/// belong to the kernel on an rdma-core device.
pub(crate) fn qp_type_raw(t: QpType) -> Result<u32, VerbsError> {
    match t {
        QpType::Rc => Ok(raw::IBV_QPT_RC),
        QpType::Uc => Ok(raw::IBV_QPT_UC),
        QpType::Ud => Ok(raw::IBV_QPT_UD),
        // QP1 is served through the kernel's user MAD interface
        // (`provider::gsi`), never as a device QP.
        QpType::Smi | QpType::Gsi => Err(VerbsError::NotSupported(
            "QP0/QP1 as device QPs: the kernel owns them on an rdma-core device",
        )),
    }
}

/// `IBV_SEND_*` of our flags.
pub(crate) fn send_flags(f: SendFlags) -> u32 {
    let mut r = 0;
    for (ours, theirs) in [
        (SendFlags::SIGNALED, raw::IBV_SEND_SIGNALED),
        (SendFlags::SOLICITED, raw::IBV_SEND_SOLICITED),
        (SendFlags::FENCE, raw::IBV_SEND_FENCE),
        (SendFlags::INLINE, raw::IBV_SEND_INLINE),
    ] {
        if f.contains(ours) {
            r |= theirs;
        }
    }
    r
}

/// `IBV_WR_*` of an opcode.
pub(crate) fn wr_opcode(op: SendOpcode) -> u32 {
    use raw::wr_opcode::*;
    match op {
        SendOpcode::Send => SEND,
        SendOpcode::SendWithImm => SEND_WITH_IMM,
        SendOpcode::SendWithInv => SEND_WITH_INV,
        SendOpcode::RdmaWrite => RDMA_WRITE,
        SendOpcode::RdmaWriteWithImm => RDMA_WRITE_WITH_IMM,
        SendOpcode::RdmaRead => RDMA_READ,
        SendOpcode::AtomicCmpSwp => ATOMIC_CMP_AND_SWP,
        SendOpcode::AtomicFetchAdd => ATOMIC_FETCH_AND_ADD,
        SendOpcode::LocalInv => LOCAL_INV,
        SendOpcode::BindMw => BIND_MW,
    }
}

/// Whether a QP of type `t` can carry `op` (IBA 11.4.1.1: UD sends only;
/// UC has no READ or atomics).
pub(crate) fn opcode_allowed(t: QpType, op: SendOpcode) -> bool {
    use SendOpcode::*;
    match t {
        QpType::Rc => true,
        QpType::Uc => !matches!(op, RdmaRead | AtomicCmpSwp | AtomicFetchAdd),
        QpType::Ud | QpType::Smi | QpType::Gsi => matches!(op, Send | SendWithImm),
    }
}

/// An address vector for the device; `sgid_index` is already the device's
/// table index.
pub(crate) fn ah_attr(a: &AhAttr, sgid_index: u8) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: a.dgid.0 },
            flow_label: 0,
            sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: 0,
        },
        dlid: a.dlid.0,
        sl: a.sl,
        src_path_bits: 0,
        static_rate: 0,
        is_global: u8::from(a.grh),
        port_num: a.port.0,
    }
}

/// `attr` as `ibv_modify_qp` takes it, with its mask. `sgid` maps the
/// AV's GID index (ours, see the crate docs) to the device's. Alternate
/// paths and migration states are refused: no path migration here yet.
pub(crate) fn qp_attr(
    attr: &QpAttr,
    sgid: impl Fn(&AhAttr) -> Result<u8, VerbsError>,
) -> Result<(ibv_qp_attr, i32), VerbsError> {
    use raw::qp_mask::*;
    if attr.alt_path.is_some() || attr.path_mig_state.is_some() {
        return Err(VerbsError::NotSupported("alternate paths (APM)"));
    }
    let mut a = ibv_qp_attr::default();
    let mut mask = 0;
    macro_rules! set {
        ($field:ident => $bit:ident; $v:ident => $e:expr) => {
            if let Some($v) = attr.$field {
                $e;
                mask |= $bit;
            }
        };
    }
    set!(state => STATE; v => a.qp_state = qp_state_raw(v));
    set!(port => PORT; v => a.port_num = v.0);
    set!(pkey_index => PKEY_INDEX; v => a.pkey_index = v);
    set!(qkey => QKEY; v => a.qkey = v.0);
    set!(access => ACCESS_FLAGS; v => a.qp_access_flags = v.bits());
    set!(path_mtu => PATH_MTU; v => a.path_mtu = u32::from(v.code()));
    set!(dest_qpn => DEST_QPN; v => a.dest_qp_num = v.value());
    set!(rq_psn => RQ_PSN; v => a.rq_psn = v.value());
    set!(sq_psn => SQ_PSN; v => a.sq_psn = v.value());
    set!(max_dest_rd_atomic => MAX_DEST_RD_ATOMIC; v => a.max_dest_rd_atomic = v);
    set!(max_rd_atomic => MAX_QP_RD_ATOMIC; v => a.max_rd_atomic = v);
    set!(min_rnr_timer => MIN_RNR_TIMER; v => a.min_rnr_timer = v);
    set!(timeout => TIMEOUT; v => a.timeout = v);
    set!(retry_cnt => RETRY_CNT; v => a.retry_cnt = v);
    set!(rnr_retry => RNR_RETRY; v => a.rnr_retry = v);
    set!(en_sqd_async_notify => EN_SQD_ASYNC_NOTIFY; v => a.en_sqd_async_notify = u8::from(v));
    if let Some(av) = &attr.av {
        a.ah_attr = ah_attr(av, sgid(av)?);
        mask |= AV;
    }
    Ok((a, mask))
}

/// An MTU code the device reports (a bad one reads as 256).
pub(crate) fn mtu(code: i32) -> Mtu {
    u8::try_from(code)
        .ok()
        .and_then(|c| Mtu::from_code(c).ok())
        .unwrap_or(Mtu::Mtu256)
}

/// Why verb `op` failed, from its errno.
pub(crate) fn error(op: &'static str, e: Errno) -> VerbsError {
    match e.0 {
        libc::EOPNOTSUPP | libc::ENOSYS => VerbsError::NotSupported(op),
        libc::ENOMEM | libc::ENOSPC | libc::EMFILE | libc::ENFILE => VerbsError::OutOfResources(op),
        libc::EBUSY => VerbsError::Busy(op),
        _ => VerbsError::InvalidArgument(format!("{op}: {e}")),
    }
}

/// Why a work request was refused by the driver: a full queue is
/// `QueueFull`, the rest as [`error`].
pub(crate) fn post_error(op: &'static str, e: Errno) -> VerbsError {
    match e.0 {
        libc::ENOMEM | libc::ENOSPC => VerbsError::QueueFull,
        _ => error(op, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_types::{AccessFlags, Gid, PortNum, Psn};

    #[test]
    fn statuses_and_opcodes_read_as_libibverbs_numbers_them() {
        assert_eq!(wc_status(0), WcStatus::Success);
        assert_eq!(wc_status(5), WcStatus::WrFlushErr);
        assert_eq!(wc_status(10), WcStatus::RemAccessErr);
        assert_eq!(wc_status(13), WcStatus::RnrRetryExcErr);
        assert_eq!(wc_status(21), WcStatus::GeneralErr);
        // IBV_WC_TM_ERR and anything later.
        assert_eq!(wc_status(22), WcStatus::GeneralErr);
        assert_eq!(wc_status(u32::MAX), WcStatus::GeneralErr);
        for s in 0..22 {
            assert_eq!(wc_status(s) as u32, s);
        }
        assert_eq!(wc_opcode(2), WcOpcode::RdmaRead);
        assert_eq!(wc_opcode(128), WcOpcode::Recv);
        assert_eq!(wc_opcode(129), WcOpcode::RecvRdmaWithImm);
        assert_eq!(wc_opcode(7), WcOpcode::Send, "IBV_WC_TSO reads as SEND");
    }

    #[test]
    fn a_completion_carries_immediate_data_in_host_order() {
        let raw = ibv_wc {
            wr_id: 7,
            status: 0,
            opcode: raw::wc_opcode::RECV,
            byte_len: 12,
            imm_or_inv: 0xabcdu32.to_be(),
            src_qp: 0x11,
            wc_flags: raw::IBV_WC_WITH_IMM | raw::IBV_WC_GRH,
            pkey_index: 3,
            slid: 9,
            ..Default::default()
        };
        let wc = work_completion(&raw, 20, raw::IBV_WC_WITH_INV);
        assert_eq!(
            (wc.wr_id, wc.opcode, wc.byte_len, wc.imm, wc.qp_ctx),
            (7, WcOpcode::Recv, 12, 0xabcd, 20)
        );
        assert!(wc.wc_flags.contains(WcFlags::WITH_IMM) && wc.wc_flags.contains(WcFlags::GRH));
        assert!(!wc.wc_flags.contains(WcFlags::WITH_INV));
        assert_eq!(
            (wc.src_qp.value(), wc.pkey_index, wc.slid),
            (0x11, 3, Lid(9))
        );
        let inv = ibv_wc {
            imm_or_inv: 0x1234,
            wc_flags: raw::IBV_WC_WITH_INV,
            ..raw
        };
        let wc = work_completion(&inv, 0, raw::IBV_WC_WITH_INV);
        assert_eq!(wc.invalidated_rkey, Rkey(0x1234));
        assert_eq!(wc.imm, 0);
        // rxe's receive of a SEND with invalidate carries the kernel's bit.
        let rxe = with_inv_flag(0xff_ffff);
        let from_rxe = ibv_wc {
            wc_flags: 1 << 2,
            ..inv
        };
        let wc = work_completion(&from_rxe, 0, rxe);
        assert!(wc.wc_flags.contains(WcFlags::WITH_INV));
        assert_eq!(wc.invalidated_rkey, Rkey(0x1234));
        // Elsewhere that bit is IBV_WC_IP_CSUM_OK, not an invalidation.
        let csum = work_completion(&from_rxe, 0, with_inv_flag(0x02c9));
        assert!(!csum.wc_flags.contains(WcFlags::WITH_INV));
        assert_eq!(csum.invalidated_rkey, Rkey(0));
        let wc = work_completion(&inv, 0, rxe);
        assert!(
            !wc.wc_flags.contains(WcFlags::WITH_INV),
            "bit 3 means nothing on rxe"
        );
    }

    #[test]
    fn send_flags_move_to_their_ibverbs_bits() {
        assert_eq!(send_flags(SendFlags::SIGNALED), raw::IBV_SEND_SIGNALED);
        assert_eq!(
            send_flags(SendFlags::SOLICITED | SendFlags::FENCE | SendFlags::INLINE),
            raw::IBV_SEND_SOLICITED | raw::IBV_SEND_FENCE | raw::IBV_SEND_INLINE
        );
        assert_eq!(send_flags(SendFlags::default()), 0);
    }

    #[test]
    fn qp_types_and_opcodes() {
        assert_eq!(qp_type_raw(QpType::Ud), Ok(raw::IBV_QPT_UD));
        assert!(matches!(
            qp_type_raw(QpType::Gsi),
            Err(VerbsError::NotSupported(_))
        ));
        assert!(opcode_allowed(QpType::Rc, SendOpcode::AtomicFetchAdd));
        assert!(!opcode_allowed(QpType::Uc, SendOpcode::RdmaRead));
        assert!(opcode_allowed(QpType::Uc, SendOpcode::RdmaWriteWithImm));
        assert!(!opcode_allowed(QpType::Ud, SendOpcode::RdmaWrite));
        assert!(opcode_allowed(QpType::Ud, SendOpcode::SendWithImm));
        assert_eq!(wr_opcode(SendOpcode::Send), raw::wr_opcode::SEND);
        assert_eq!(wr_opcode(SendOpcode::BindMw), 8);
        assert_eq!(wr_opcode(SendOpcode::LocalInv), 7);
        assert_eq!(wr_opcode(SendOpcode::SendWithInv), 9);
        for s in [
            QpState::Reset,
            QpState::Init,
            QpState::Rtr,
            QpState::Rts,
            QpState::Sqd,
            QpState::Sqe,
            QpState::Err,
        ] {
            assert_eq!(qp_state(qp_state_raw(s)), s);
        }
        assert_eq!(qp_state(7), QpState::Err, "IBV_QPS_UNKNOWN");
    }

    #[test]
    fn an_rtr_modify_sets_each_given_attribute_and_its_mask_bit() {
        use raw::qp_mask::*;
        let av = AhAttr::roce(Gid([7; 16]));
        let a = QpAttr {
            state: Some(QpState::Rtr),
            av: Some(av),
            path_mtu: Some(Mtu::Mtu1024),
            dest_qpn: Some(Qpn::from_bits(0x42)),
            rq_psn: Some(Psn::new(5)),
            max_dest_rd_atomic: Some(4),
            min_rnr_timer: Some(1),
            ..Default::default()
        };
        let (r, mask) = qp_attr(&a, |_| Ok(3)).unwrap();
        assert_eq!(
            mask,
            STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER
        );
        assert_eq!(r.qp_state, raw::qp_state::RTR);
        assert_eq!((r.path_mtu, r.dest_qp_num, r.rq_psn), (3, 0x42, 5));
        assert_eq!((r.max_dest_rd_atomic, r.min_rnr_timer), (4, 1));
        assert_eq!(r.ah_attr.grh.dgid.raw, [7; 16]);
        assert_eq!(
            (
                r.ah_attr.grh.sgid_index,
                r.ah_attr.is_global,
                r.ah_attr.port_num
            ),
            (3, 1, 1)
        );
        assert_eq!(r.ah_attr.grh.hop_limit, 64);
        let init = QpAttr {
            state: Some(QpState::Init),
            port: Some(PortNum(1)),
            pkey_index: Some(0),
            access: Some(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ),
            ..Default::default()
        };
        let (r, mask) = qp_attr(&init, |_| unreachable!("no AV")).unwrap();
        assert_eq!(mask, STATE | PORT | PKEY_INDEX | ACCESS_FLAGS);
        assert_eq!(r.qp_access_flags, 0b110);
        let alt = QpAttr {
            path_mig_state: Some(verbs::MigState::Rearm),
            ..Default::default()
        };
        assert!(matches!(
            qp_attr(&alt, |_| Ok(0)),
            Err(VerbsError::NotSupported(_))
        ));
        // A bad GID index refuses the whole modify.
        let bad = qp_attr(&a, |_| Err(VerbsError::InvalidArgument("sgid".into())));
        assert!(matches!(bad, Err(VerbsError::InvalidArgument(_))));
    }

    #[test]
    fn errnos_become_errors_that_say_what_to_do() {
        assert_eq!(
            error("create_qp", Errno(libc::EOPNOTSUPP)),
            VerbsError::NotSupported("create_qp")
        );
        assert_eq!(
            error("create_cq", Errno(libc::ENOMEM)),
            VerbsError::OutOfResources("create_cq")
        );
        assert_eq!(
            post_error("post_send", Errno(libc::ENOMEM)),
            VerbsError::QueueFull
        );
        match error("modify_qp", Errno(libc::EINVAL)) {
            VerbsError::InvalidArgument(m) => assert!(m.starts_with("modify_qp: Invalid argument")),
            e => panic!("{e:?}"),
        }
        assert_eq!(mtu(3), Mtu::Mtu1024);
        assert_eq!(mtu(0), Mtu::Mtu256);
    }
}
