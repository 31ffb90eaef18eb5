//! Unsignaled work requests on soft RoCE: a successful one completes
//! silently, and its `wr_id` is the consumer's to reuse at once; a later
//! signaled request with the same `wr_id` completes as any other (issue 23 item 6: the provider kept the
//! `wr_id`s of unsignaled requests to filter completions the engine
//! never made, so the set only grew and the later completion was lost).
//!
//! Two CAs on 127.0.178.1 and .2, RoCEv2 on UDP port 47178.

mod common;

use common::Soft;
use rdma_types::{Rkey, WcOpcode, WcStatus};
use std::net::{IpAddr, Ipv4Addr};
use verbs::conformance::rc_pair;
use verbs::{SendFlags, SendOpcode, SendWr, Sge};

fn write(wr_id: u64, sge: Sge, addr: u64, rkey: Rkey, signaled: bool) -> SendWr {
    let mut w = SendWr::new(wr_id, SendOpcode::RdmaWrite, vec![sge]);
    w.remote.addr = addr;
    w.remote.rkey = rkey;
    if !signaled {
        w.flags = SendFlags(0);
    }
    w
}

#[test]
fn a_signaled_wr_reusing_an_unsignaled_wr_id_completes() {
    let ip = |k: u8| IpAddr::V4(Ipv4Addr::new(127, 0, 178, k));
    let f = Soft::pair(ip(1), ip(2), 47178);
    let (a, qa, b, _qb) = rc_pair(&f);
    a.buf.write_at(0, &[0x11; 64]);
    a.buf.write_at(64, &[0x22; 64]);
    let dst = b.buf.addr();
    // Unsignaled WRITE 7, then signaled WRITE 7 behind it: one completion,
    // the second's (the first is acknowledged before it, RC in order).
    let wrs = [
        write(7, a.sge(0, 64), dst, b.mr.rkey, false),
        write(7, a.sge(64, 64), dst + 64, b.mr.rkey, true),
    ];
    a.p.post_send(qa, &wrs).unwrap();
    let wc = a.wc();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (7, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert_eq!(b.buf.to_vec(0, 128), [[0x11; 64], [0x22; 64]].concat());
    a.no_wc();
    // Many unsignaled requests leave nothing behind: each later signaled
    // one reusing their wr_ids completes, none of theirs ever does.
    for round in 0..50u64 {
        let id = round % 5;
        a.p.post_send(qa, &[write(id, a.sge(0, 8), dst, b.mr.rkey, false)])
            .unwrap();
        a.p.post_send(qa, &[write(id, a.sge(0, 8), dst, b.mr.rkey, true)])
            .unwrap();
        let wc = a.wc();
        assert_eq!(
            (wc.wr_id, wc.status),
            (id, WcStatus::Success),
            "round {round}"
        );
    }
    a.no_wc();
}
