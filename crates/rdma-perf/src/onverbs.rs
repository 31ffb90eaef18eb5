//! `rperf`'s QP on a NIC behind the verbs (`rperf --device`, see
//! [`crate::device`]): the PD, CQ, RC QP and registered buffer of one
//! test, connected from the out-of-band hello, posting and polling
//! through the provider. The soft NIC's own engine (`softroce::Node`)
//! stays the default; this is the same test on a device the kernel or the
//! hardware runs.

use crate::device::Nic;
use rdma_types::{AccessFlags, Gid, Mtu, Psn, QpState, Qpn, WcOpcode, WcStatus};
use std::collections::VecDeque;
use std::sync::Arc;
use verbs::{
    CqInit, MemBuf, QpAttr, QpInit, RecvWr, RemoteAddr, SendOpcode, SendWr, Sge, WorkCompletion,
};

/// READs (and their responses) in flight each way at most, and the
/// device's limit below that.
const READS: u8 = 16;

/// Completions taken from the CQ per poll.
const BATCH: usize = 32;

/// One side's verbs objects.
pub(crate) struct VerbsQp {
    nic: Arc<Nic>,
    pd: verbs::PdHandle,
    cq: verbs::CqHandle,
    qp: verbs::QpHandle,
    qpn: u32,
    pub(crate) mem: MemBuf,
    mr: verbs::MrInfo,
    reads: u8,
    mtu: Mtu,
    polled: VecDeque<WorkCompletion>,
    scratch: Vec<WorkCompletion>,
    /// Work requests posted since the last flush: each kind goes to the
    /// provider in one call ([`VerbsQp::flush`]), as a NIC takes a burst.
    sends: Vec<SendWr>,
    recvs: Vec<RecvWr>,
}

fn err(what: &str, nic: &Nic) -> impl FnOnce(verbs::VerbsError) -> String {
    let at = nic.name().to_string();
    let what = what.to_string();
    move |e| format!("{what} on {at}: {e}")
}

impl VerbsQp {
    /// The objects of one test on `nic`: a buffer of `len` bytes, a QP
    /// with room for `send` and `recv` work requests, path MTU at most
    /// `mtu`.
    pub(crate) fn new(
        nic: Arc<Nic>,
        len: usize,
        send: usize,
        recv: usize,
        mtu: Mtu,
    ) -> Result<VerbsQp, String> {
        let p = nic.provider().clone();
        let attr = p.query_ca(nic.ca()).map_err(err("query the CA", &nic))?;
        let pd = p
            .alloc_pd(nic.ca(), 0)
            .map_err(err("allocate a PD", &nic))?;
        let depth = |n: usize| u32::try_from(n.max(1)).unwrap_or(u32::MAX);
        let cq = match p.create_cq(
            pd,
            &CqInit {
                cqe: depth(send).saturating_add(depth(recv)).saturating_add(16),
            },
            0,
        ) {
            Ok(c) => c,
            Err(e) => {
                let _ = p.dealloc_pd(pd);
                return Err(err("create the CQ", &nic)(e));
            }
        };
        let undo = |qp: Option<verbs::QpHandle>| {
            if let Some(q) = qp {
                let _ = p.destroy_qp(q);
            }
            let _ = p.destroy_cq(cq);
            let _ = p.dealloc_pd(pd);
        };
        let qp = match p.create_qp(pd, &QpInit::rc(cq, depth(send), depth(recv)), 0) {
            Ok(q) => q,
            Err(e) => {
                undo(None);
                return Err(err("create the QP", &nic)(e));
            }
        };
        let qpn = match p.qp_num(qp) {
            Ok(n) => n.value(),
            Err(e) => {
                undo(Some(qp));
                return Err(err("read the QP number", &nic)(e));
            }
        };
        let mem = MemBuf::new(len);
        let access =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
        let mr = match p.reg_mr(pd, &mem, mem.addr(), mem.len() as u64, access, 0) {
            Ok(m) => m,
            Err(e) => {
                undo(Some(qp));
                return Err(err("register the buffer", &nic)(e));
            }
        };
        Ok(VerbsQp {
            reads: attr.max_qp_rd_atom.clamp(1, READS),
            mtu: nic.path_mtu(mtu),
            nic,
            pd,
            cq,
            qp,
            qpn,
            mem,
            mr,
            polled: VecDeque::new(),
            scratch: vec![WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0); BATCH],
            sends: Vec::new(),
            recvs: Vec::new(),
        })
    }

    pub(crate) fn qpn(&self) -> u32 {
        self.qpn
    }

    pub(crate) fn rkey(&self) -> u32 {
        self.mr.rkey.0
    }

    /// Where the buffer starts in the peer's RDMA addresses.
    pub(crate) fn base(&self) -> u64 {
        self.mem.addr()
    }

    pub(crate) fn mtu(&self) -> Mtu {
        self.mtu
    }

    /// Our port's GID (the one rdma-core's tools would pick).
    pub(crate) fn gid(&self) -> Option<Gid> {
        self.nic.port_attr().gids.first().copied()
    }

    /// INIT, RTR to `dgid`'s QP `dqpn` (its first PSN `rq_psn`), RTS with
    /// our first PSN `sq_psn`, at path MTU `mtu`.
    pub(crate) fn connect(
        &self,
        dgid: Gid,
        dqpn: u32,
        rq_psn: u32,
        sq_psn: u32,
        mtu: Mtu,
    ) -> Result<(), String> {
        let p = self.nic.provider();
        let step = |what: &str, attr: QpAttr| {
            p.modify_qp(self.qp, &attr)
                .map_err(|e| format!("QP to {what} on {}: {e}", self.nic.name()))
        };
        self.nic
            .init_qp(
                self.qp,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
            )
            .map_err(|e| format!("QP to INIT on {}: {e}", self.nic.name()))?;
        step(
            "RTR",
            QpAttr {
                state: Some(QpState::Rtr),
                av: Some(self.nic.av(dgid)),
                path_mtu: Some(self.mtu.min(mtu)),
                dest_qpn: Some(Qpn::from_bits(dqpn)),
                rq_psn: Some(Psn::new(rq_psn)),
                max_dest_rd_atomic: Some(self.reads),
                min_rnr_timer: Some(12),
                ..Default::default()
            },
        )?;
        step(
            "RTS",
            QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(Psn::new(sq_psn)),
                // 4.096 us << 14 = 67 ms, as the soft side's QP.
                timeout: Some(14),
                retry_cnt: Some(7),
                rnr_retry: Some(7),
                max_rd_atomic: Some(self.reads),
                ..Default::default()
            },
        )
    }

    /// Queues one signalled WRITE, READ or SEND of `len` bytes at offset
    /// `local` of our buffer; `remote` is the peer's address for WRITE
    /// and READ. Posted at the next [`VerbsQp::flush`] (or poll).
    pub(crate) fn post_send(
        &mut self,
        wr_id: u64,
        op: crate::Op,
        local: u64,
        len: u32,
        remote: RemoteAddr,
    ) -> Result<(), String> {
        let opcode = match op {
            crate::Op::Write => SendOpcode::RdmaWrite,
            crate::Op::Read => SendOpcode::RdmaRead,
            crate::Op::Send => SendOpcode::Send,
        };
        let mut wr = SendWr::new(
            wr_id,
            opcode,
            vec![Sge {
                addr: self.mem.addr() + local,
                length: len,
                lkey: self.mr.lkey,
            }],
        );
        if op != crate::Op::Send {
            wr.remote = remote;
        }
        self.sends.push(wr);
        Ok(())
    }

    /// Posts what was queued since the last call: the receives first (a
    /// SEND of ours may be answered by one of the peer's), each kind in
    /// one call.
    pub(crate) fn flush(&mut self) -> Result<(), String> {
        let p = self.nic.provider();
        if !self.recvs.is_empty() {
            let r = p.post_recv(self.qp, &self.recvs);
            self.recvs.clear();
            r.map_err(|e| format!("post a receive on {}: {e}", self.nic.name()))?;
        }
        if !self.sends.is_empty() {
            let r = p.post_send(self.qp, &self.sends);
            self.sends.clear();
            r.map_err(|e| format!("post a send on {}: {e}", self.nic.name()))?;
        }
        Ok(())
    }

    /// Queues one receive of `len` bytes at offset `local` (posted at
    /// the next [`VerbsQp::flush`] or poll).
    pub(crate) fn post_recv(&mut self, wr_id: u64, local: u64, len: u32) -> Result<(), String> {
        let wr = RecvWr {
            wr_id,
            sges: verbs::sges![Sge {
                addr: self.mem.addr() + local,
                length: len,
                lkey: self.mr.lkey,
            }],
        };
        self.recvs.push(wr);
        Ok(())
    }

    /// Takes all the CQ holds into the queue [`VerbsQp::next`] reads;
    /// with `sleep`, waits (at most a millisecond, the CQ armed) when it
    /// holds nothing. Returns whether anything came.
    pub(crate) fn poll(&mut self, sleep: bool) -> Result<bool, String> {
        self.flush()?;
        let p = self.nic.provider().clone();
        // Everything the CQ holds (at most its size): a server answering
        // the client's end of test must have counted every receive.
        let take = |me: &mut VerbsQp| -> Result<usize, String> {
            let mut all = 0;
            loop {
                let n = p
                    .poll_cq(me.cq, &mut me.scratch)
                    .map_err(|e| format!("poll the CQ on {}: {e}", me.nic.name()))?;
                me.polled.extend(me.scratch[..n].iter().copied());
                all += n;
                if n < me.scratch.len() {
                    return Ok(all);
                }
            }
        };
        if take(self)? > 0 {
            return Ok(true);
        }
        // A soft NIC in this process (the NIC daemon's client runs its
        // QPs here) takes what its socket holds on this thread, without
        // waiting: the NIC's own thread would have to be woken for it.
        let now = std::time::Duration::ZERO;
        if p.drive_cq(self.cq, now, now).unwrap_or(false) && take(self)? > 0 {
            return Ok(true);
        }
        if !sleep {
            return Ok(false);
        }
        // A soft NIC in this process (the NIC daemon's client runs its
        // QPs here) does its work on this thread while we wait: looking
        // first, for a moment, then sleeping on its socket. Elsewhere
        // `wait_cq` looks at the CQ itself: no arm (the CA's handler
        // ignores events, and through the daemon's rings each armed
        // completion would cost an event on its socket).
        let ms = std::time::Duration::from_millis(1);
        if !p.drive_cq(self.cq, DRIVE_SPIN, ms).unwrap_or(false) {
            let _ = p.wait_cq(self.cq, ms);
        }
        Ok(take(self)? > 0)
    }

    /// The next completion taken by [`VerbsQp::poll`].
    pub(crate) fn next(&mut self) -> Option<WorkCompletion> {
        self.polled.pop_front()
    }
}

/// How long a wait for completions looks before it sleeps, where the
/// provider lets this thread drive the NIC ([`verbs::Provider::drive_cq`]).
const DRIVE_SPIN: std::time::Duration = std::time::Duration::from_micros(50);

impl Drop for VerbsQp {
    /// The objects go children first; the CA stays open for the next
    /// test (a server's next client).
    fn drop(&mut self) {
        let p = self.nic.provider();
        let _ = p.destroy_qp(self.qp);
        let _ = p.dereg_mr(self.mr.handle);
        let _ = p.destroy_cq(self.cq);
        let _ = p.dealloc_pd(self.pd);
    }
}

#[cfg(test)]
mod tests {
    //! rperf's test through the verbs, on a provider this host has: our
    //! soft RoCE NIC's verbs provider (`rnic::softroce`) in place of an
    //! rdma-core device, so every step `--device` takes (objects, the
    //! hello with GID and buffer address, connect, post, poll, the
    //! server's digest) runs here; rxe in the project's VMs runs the
    //! same code on libibverbs.

    use crate::device::{Nic, NicChoice};
    use crate::{run_client, run_server, ClientConfig, Common, Op};
    use rdma_types::Mtu;
    use std::net::TcpListener;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    /// A test's RoCEv2 UDP port: its own, so tests running at once (and
    /// other tests of the workspace on 4791) do not meet.
    fn nic(ip: &str, udp_port: u16) -> Arc<Nic> {
        let c = NicChoice::Soft {
            ip: ip.parse().unwrap(),
            udp_port,
            mtu: Mtu::Mtu1024,
            opts: rnic::softroce::NicOptions::default(),
        };
        Arc::new(Nic::open(&c).unwrap())
    }

    fn common(nic: Arc<Nic>) -> Common {
        Common {
            // Unused on a device.
            bind: "192.0.2.1:9".parse().unwrap(),
            mtu: Mtu::Mtu4096,
            faults: None,
            capture: None,
            buffer: 1 << 20,
            gso: false,
            stop: Arc::new(AtomicBool::new(false)),
            device: Some(nic),
        }
    }

    /// Runs `tests` (op, bidir) one client each against one server.
    fn run(host: u8, udp_port: u16, tests: &[(Op, bool)]) -> Vec<crate::Report> {
        let server_nic = nic(&format!("127.0.88.{host}"), udp_port);
        let client_nic = nic(&format!("127.0.88.{}", host + 1), udp_port);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let oob = listener.local_addr().unwrap();
        let sc = common(server_nic);
        let n = tests.len();
        let server = std::thread::spawn(move || {
            (0..n)
                .map(|_| run_server(&sc, &listener).map_err(|e| e.to_string()))
                .collect::<Vec<_>>()
        });
        let mut reports = Vec::new();
        for &(op, bidir) in tests {
            let cfg = ClientConfig {
                common: common(client_nic.clone()),
                server: oob,
                op,
                size: 8192,
                qd: 8,
                iters: 200,
                duration: None,
                verify: true,
                baseline: false,
                bidir,
            };
            reports.push(run_client(&cfg).unwrap_or_else(|e| panic!("{op:?}: {e}")));
        }
        for s in server.join().unwrap() {
            let s = s.unwrap();
            assert!(!s.interrupted);
        }
        reports
    }

    #[test]
    fn write_read_and_send_are_verified_through_the_verbs() {
        let reports = run(
            1,
            24_791,
            &[(Op::Write, false), (Op::Read, false), (Op::Send, false)],
        );
        for r in &reports {
            assert_eq!(r.iters, 200, "{r:?}");
            assert!(r.verified, "{r:?}");
            assert!(r.gbit_per_s > 0.0, "{r:?}");
            let d = r.device.as_deref().unwrap();
            assert!(d.starts_with("softroce0 (127.0.88.2) port 1"), "{d}");
            assert!(r.table().contains(" on rdma-core device softroce0"));
        }
    }

    #[test]
    fn a_bidirectional_write_goes_both_ways_through_the_verbs() {
        let r = &run(3, 24_792, &[(Op::Write, true)])[0];
        assert!(r.verified, "{r:?}");
        assert!(r.reverse_gbit_per_s.is_some_and(|g| g > 0.0), "{r:?}");
    }
}
