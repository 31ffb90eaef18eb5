//! Between the CM state machines' messages and CM MAD bytes.

use crate::agent::QpParams;
use rdma_cm::{CmMsg, MsgKind, RejReason, Timing};
use rdma_mad::cm::{
    private_len, CmAttr, CmMadRepr, CmMessage, CmPath, DreqRepr, IdsRepr, MraRepr, MsgRef, RejRepr,
    RepRepr, ReqRepr,
};
use rdma_mad::MAD_SIZE;
use rdma_types::{Gid, Guid, Mtu, Qkey, Qpn, TimeoutExp};

/// What this end puts in every REQ and REP besides the state machine's
/// values.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Local {
    pub guid: Guid,
    pub gid: Gid,
    pub mtu: Mtu,
}

/// What one connection's REQ or REP offers besides the state machine's
/// values: the QP parameters, and the REQ's path MTU.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Offer {
    pub params: QpParams,
    pub mtu: Mtu,
}

fn pad<const N: usize>(data: &[u8]) -> [u8; N] {
    let mut b = [0u8; N];
    let n = data.len().min(N);
    b[..n].copy_from_slice(&data[..n]);
    b
}

fn mtu_code(m: Mtu) -> u8 {
    match m.bytes() {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        _ => 5,
    }
}

/// The path MTU a REQ carries, as a [`Mtu`].
pub(crate) fn mtu_of(code: u8) -> Mtu {
    match code {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        4 => Mtu::Mtu2048,
        _ => Mtu::Mtu4096,
    }
}

fn msg_ref(k: MsgKind) -> MsgRef {
    match k {
        MsgKind::Req => MsgRef::Req,
        MsgKind::Rep => MsgRef::Rep,
        MsgKind::Other => MsgRef::Other,
    }
}

fn msg_kind(r: MsgRef) -> MsgKind {
    match r {
        MsgRef::Req => MsgKind::Req,
        MsgRef::Rep => MsgKind::Rep,
        _ => MsgKind::Other,
    }
}

/// Encodes `msg` for `peer` as a CM MAD with transaction ID `tid`.
/// `peer_qpn` is the peer's QP (DREQ names it).
pub(crate) fn encode(
    msg: &CmMsg,
    tid: u64,
    local: &Local,
    peer: Gid,
    peer_qpn: Qpn,
    offer: &Offer,
) -> [u8; MAD_SIZE] {
    let q = offer.params;
    let (attr, message) = match msg {
        CmMsg::Req {
            local_comm_id,
            service_id,
            qpn,
            psn,
            pkey,
            timing,
            private_data,
        } => (
            CmAttr::Req,
            CmMessage::Req(Box::new(ReqRepr {
                local_comm_id: *local_comm_id,
                service_id: *service_id,
                local_ca_guid: local.guid,
                local_qkey: Qkey(0),
                local_qpn: *qpn,
                responder_resources: q.responder_resources,
                local_eecn: 0,
                initiator_depth: q.initiator_depth,
                remote_eecn: 0,
                remote_cm_response_timeout: timing.remote_cm_response_timeout.value(),
                transport_type: 0,
                flow_control: false,
                starting_psn: *psn,
                local_cm_response_timeout: timing.local_cm_response_timeout.value(),
                retry_count: q.retry_count.min(7),
                pkey: *pkey,
                path_mtu: mtu_code(offer.mtu),
                rdc_exists: false,
                rnr_retry_count: q.rnr_retry_count.min(7),
                max_cm_retries: 15,
                srq: false,
                extended_transport_type: 0,
                primary_path: CmPath {
                    // RoCE has no LIDs: the permissive LID, as Linux sends.
                    local_lid: 0xffff,
                    remote_lid: 0xffff,
                    local_gid: local.gid,
                    remote_gid: peer,
                    flow_label: 0,
                    packet_rate: 0,
                    traffic_class: 0,
                    hop_limit: 64,
                    sl: 0,
                    subnet_local: false,
                    local_ack_timeout: timing.local_ack_timeout().value(),
                },
                alternate_path: None,
                private_data: pad::<{ private_len::REQ }>(private_data),
            })),
        ),
        CmMsg::Rep {
            local_comm_id,
            remote_comm_id,
            qpn,
            psn,
            private_data,
        } => (
            CmAttr::Rep,
            CmMessage::Rep(Box::new(RepRepr {
                local_comm_id: *local_comm_id,
                remote_comm_id: *remote_comm_id,
                local_qkey: Qkey(0),
                local_qpn: *qpn,
                local_eecn: 0,
                starting_psn: *psn,
                responder_resources: q.responder_resources,
                initiator_depth: q.initiator_depth,
                target_ack_delay: 0,
                failover_accepted: 0,
                flow_control: false,
                rnr_retry_count: q.rnr_retry_count.min(7),
                srq: false,
                local_ca_guid: local.guid,
                private_data: pad::<{ private_len::REP }>(private_data),
            })),
        ),
        CmMsg::Rej {
            local_comm_id,
            remote_comm_id,
            msg,
            reason,
            private_data,
        } => (
            CmAttr::Rej,
            CmMessage::Rej(Box::new(RejRepr {
                local_comm_id: *local_comm_id,
                remote_comm_id: *remote_comm_id,
                message_rejected: msg_ref(*msg),
                reject_info_len: 0,
                reason: rdma_mad::cm::RejReason::from(reason.0),
                ari: [0; private_len::REJ_ARI],
                private_data: pad::<{ private_len::REJ }>(private_data),
            })),
        ),
        CmMsg::Mra {
            local_comm_id,
            remote_comm_id,
            msg,
            service_timeout,
        } => (
            CmAttr::Mra,
            CmMessage::Mra(Box::new(MraRepr {
                local_comm_id: *local_comm_id,
                remote_comm_id: *remote_comm_id,
                message_mraed: msg_ref(*msg),
                service_timeout: service_timeout.value(),
                private_data: [0; private_len::MRA],
            })),
        ),
        CmMsg::Rtu {
            local_comm_id,
            remote_comm_id,
        } => (
            CmAttr::Rtu,
            CmMessage::Rtu(Box::new(IdsRepr {
                local_comm_id: *local_comm_id,
                remote_comm_id: *remote_comm_id,
                private_data: [0; private_len::RTU],
            })),
        ),
        CmMsg::Dreq {
            local_comm_id,
            remote_comm_id,
        } => (
            CmAttr::Dreq,
            CmMessage::Dreq(Box::new(DreqRepr {
                local_comm_id: *local_comm_id,
                remote_comm_id: *remote_comm_id,
                remote_qpn: peer_qpn,
                private_data: [0; private_len::DREQ],
            })),
        ),
        CmMsg::Drep {
            local_comm_id,
            remote_comm_id,
        } => (
            CmAttr::Drep,
            CmMessage::Drep(Box::new(IdsRepr {
                local_comm_id: *local_comm_id,
                remote_comm_id: *remote_comm_id,
                private_data: [0; private_len::DREP],
            })),
        ),
    };
    CmMadRepr {
        header: CmMadRepr::header_for(attr, tid),
        message,
    }
    .to_bytes()
}

/// What a REQ or REP says beyond the state machine's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Extra {
    /// The REQ's path MTU (a REP has none: the requester's port's).
    pub mtu: Option<Mtu>,
    pub remote_gid: Option<Gid>,
    /// The sender's QP parameters (the REP's retry count is the REQ's).
    pub params: QpParams,
}

/// Decodes a CM MAD. `None` for MADs the state machines do not handle
/// (SIDR, LAP/APR, ClassPortInfo) or that do not parse.
pub(crate) fn decode(mad: &[u8]) -> Option<(CmMsg, Option<Extra>)> {
    let m = CmMadRepr::parse(mad).ok()?;
    Some(match m.message {
        CmMessage::Req(r) => (
            CmMsg::Req {
                local_comm_id: r.local_comm_id,
                service_id: r.service_id,
                qpn: r.local_qpn,
                psn: r.starting_psn,
                pkey: r.pkey,
                timing: Timing {
                    // The sender put its path's packet lifetime + 1 there.
                    packet_life_time: TimeoutExp::from_bits(r.primary_path.local_ack_timeout)
                        .saturating_sub(1),
                    local_cm_response_timeout: TimeoutExp::from_bits(r.local_cm_response_timeout),
                    remote_cm_response_timeout: TimeoutExp::from_bits(r.remote_cm_response_timeout),
                },
                private_data: r.private_data.to_vec(),
            },
            Some(Extra {
                mtu: Some(mtu_of(r.path_mtu)),
                remote_gid: Some(r.primary_path.local_gid),
                params: QpParams {
                    responder_resources: r.responder_resources,
                    initiator_depth: r.initiator_depth,
                    retry_count: r.retry_count,
                    rnr_retry_count: r.rnr_retry_count,
                },
            }),
        ),
        CmMessage::Rep(r) => (
            CmMsg::Rep {
                local_comm_id: r.local_comm_id,
                remote_comm_id: r.remote_comm_id,
                qpn: r.local_qpn,
                psn: r.starting_psn,
                private_data: r.private_data.to_vec(),
            },
            Some(Extra {
                mtu: None,
                remote_gid: None,
                params: QpParams {
                    responder_resources: r.responder_resources,
                    initiator_depth: r.initiator_depth,
                    retry_count: 0,
                    rnr_retry_count: r.rnr_retry_count,
                },
            }),
        ),
        CmMessage::Rej(r) => (
            CmMsg::Rej {
                local_comm_id: r.local_comm_id,
                remote_comm_id: r.remote_comm_id,
                msg: msg_kind(r.message_rejected),
                reason: RejReason(u16::from(r.reason)),
                private_data: r.private_data.to_vec(),
            },
            None,
        ),
        CmMessage::Mra(r) => (
            CmMsg::Mra {
                local_comm_id: r.local_comm_id,
                remote_comm_id: r.remote_comm_id,
                msg: msg_kind(r.message_mraed),
                service_timeout: TimeoutExp::from_bits(r.service_timeout),
            },
            None,
        ),
        CmMessage::Rtu(r) => (
            CmMsg::Rtu {
                local_comm_id: r.local_comm_id,
                remote_comm_id: r.remote_comm_id,
            },
            None,
        ),
        CmMessage::Dreq(r) => (
            CmMsg::Dreq {
                local_comm_id: r.local_comm_id,
                remote_comm_id: r.remote_comm_id,
            },
            None,
        ),
        CmMessage::Drep(r) => (
            CmMsg::Drep {
                local_comm_id: r.local_comm_id,
                remote_comm_id: r.remote_comm_id,
            },
            None,
        ),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_types::{Pkey, Psn};

    fn offer(local: &Local) -> Offer {
        Offer {
            params: QpParams::DEFAULT,
            mtu: local.mtu,
        }
    }

    #[test]
    fn every_message_survives_encode_and_decode() {
        let local = Local {
            guid: Guid(0x1122),
            gid: Gid::from_ip("127.0.0.1".parse().unwrap()),
            mtu: Mtu::Mtu1024,
        };
        let peer = Gid::from_ip("127.0.0.2".parse().unwrap());
        let offer = Offer {
            params: QpParams {
                responder_resources: 3,
                initiator_depth: 5,
                retry_count: 6,
                rnr_retry_count: 2,
            },
            mtu: Mtu::Mtu1024,
        };
        let msgs = vec![
            CmMsg::Req {
                local_comm_id: 7,
                service_id: 0x0106_0000 | 5555 | 0x0100_0000,
                qpn: Qpn::from_bits(0x11),
                psn: Psn::new(0x123456),
                pkey: Pkey(0x8010),
                timing: Timing {
                    packet_life_time: TimeoutExp::from_bits(13),
                    local_cm_response_timeout: TimeoutExp::from_bits(17),
                    remote_cm_response_timeout: TimeoutExp::from_bits(19),
                },
                private_data: vec![0xab; 92],
            },
            CmMsg::Rep {
                local_comm_id: 8,
                remote_comm_id: 7,
                qpn: Qpn::from_bits(0x12),
                psn: Psn::new(0x654321),
                private_data: vec![0xcd; 196],
            },
            CmMsg::Rej {
                local_comm_id: 8,
                remote_comm_id: 7,
                msg: MsgKind::Req,
                reason: RejReason::CONSUMER_DEFINED,
                private_data: vec![0xef; 148],
            },
            CmMsg::Mra {
                local_comm_id: 8,
                remote_comm_id: 7,
                msg: MsgKind::Rep,
                service_timeout: TimeoutExp::from_bits(14),
            },
            CmMsg::Rtu {
                local_comm_id: 7,
                remote_comm_id: 8,
            },
            CmMsg::Dreq {
                local_comm_id: 7,
                remote_comm_id: 8,
            },
            CmMsg::Drep {
                local_comm_id: 8,
                remote_comm_id: 7,
            },
        ];
        for (i, m) in msgs.into_iter().enumerate() {
            let bytes = encode(
                &m,
                0x42 + i as u64,
                &local,
                peer,
                Qpn::from_bits(0x12),
                &offer,
            );
            assert_eq!(bytes[1], 0x07, "CM class");
            let (back, extra) = decode(&bytes).expect("parses");
            assert_eq!(back, m);
            if let Some(x) = extra {
                if let Some(mtu) = x.mtu {
                    assert_eq!(mtu, Mtu::Mtu1024);
                    assert_eq!(x.remote_gid, Some(local.gid));
                    assert_eq!(x.params, offer.params);
                } else {
                    let rep = QpParams {
                        retry_count: 0,
                        ..offer.params
                    };
                    assert_eq!(x.params, rep, "a REP has no retry count");
                }
            }
        }
        assert!(decode(&[0u8; 10]).is_none(), "short MAD refused");
    }

    #[test]
    fn the_req_partition_key_is_at_byte_48_of_the_message() {
        let local = Local {
            guid: Guid(0x1122),
            gid: Gid::from_ip("127.0.0.1".parse().unwrap()),
            mtu: Mtu::Mtu1024,
        };
        let req = |pkey| CmMsg::Req {
            local_comm_id: 7,
            service_id: 0x42,
            qpn: Qpn::from_bits(0x11),
            psn: Psn::new(1),
            pkey,
            timing: rdma_cm::CmConfig::default().timing(TimeoutExp::from_bits(16)),
            private_data: vec![],
        };
        for k in [0x8010u16, 0x0020, 0xffff, 0x7fff] {
            let peer = local.gid;
            let bytes = encode(
                &req(Pkey(k)),
                1,
                &local,
                peer,
                Qpn::from_bits(0),
                &offer(&local),
            );
            // IBA 12.6.5: the REQ's Partition Key is bytes 48-49 of the
            // message, after the 24-byte MAD header.
            assert_eq!(bytes[24 + 48..24 + 50], k.to_be_bytes(), "P_Key {k:#06x}");
            let (back, _) = decode(&bytes).expect("parses");
            assert!(
                matches!(back, CmMsg::Req { pkey, .. } if pkey == Pkey(k)),
                "{back:?}"
            );
        }
    }

    #[test]
    fn the_req_carries_the_path_lifetime_and_response_timeouts() {
        let local = Local {
            guid: Guid(0x1122),
            gid: Gid::from_ip("127.0.0.1".parse().unwrap()),
            mtu: Mtu::Mtu1024,
        };
        let timing = Timing {
            packet_life_time: TimeoutExp::from_bits(16),
            local_cm_response_timeout: TimeoutExp::from_bits(18),
            remote_cm_response_timeout: TimeoutExp::from_bits(21),
        };
        let req = CmMsg::Req {
            local_comm_id: 7,
            service_id: 0x42,
            qpn: Qpn::from_bits(0x11),
            psn: Psn::new(1),
            pkey: Pkey::DEFAULT,
            timing,
            private_data: vec![],
        };
        let bytes = encode(
            &req,
            1,
            &local,
            local.gid,
            Qpn::from_bits(0),
            &offer(&local),
        );
        let Ok(CmMadRepr {
            message: CmMessage::Req(r),
            ..
        }) = CmMadRepr::parse(&bytes)
        else {
            panic!("not a REQ")
        };
        // IBA 12.6.5; Linux cm.c sends packet lifetime + 1 as the local
        // ACK timeout of the primary path.
        assert_eq!(
            (
                r.remote_cm_response_timeout,
                r.local_cm_response_timeout,
                r.primary_path.local_ack_timeout
            ),
            (21, 18, 17)
        );
    }
}
