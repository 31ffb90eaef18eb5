//! `ibsm run` on a real soft RoCE port, with nodes in the `ib`
//! personality on 127.0.131.x: the SM process sweeps them over UDP (SMPs
//! to QP0), their SMAs (`rdma_access::sma_agent`) bring the ports ACTIVE
//! with distinct LIDs, the SA answers their PathRecord and NodeRecord
//! queries, an RC connection made by the IB CM with those paths carries a
//! message, a node whose cable is pulled is reported by trap 65 to a
//! subscriber and its return by trap 64, and SIGTERM stops the SM.
//! `--once` gives a verdict. In-process, the SM's port with a partitions
//! file (P_Key tables, paths, and partitions holding on the data path),
//! tshark on the MADs it carried, and `srp_daemon`-style discovery
//! through the SA.

mod common;

use common::Ibsm;
use ib_sm::port::SmPort;
use ib_sm::SmConfig;
use rdma_access::sa::{PathQuery, SaClient, SaTiming};
use rdma_access::sma::state;
use rdma_access::IbNode;
use rdma_mad::sa::PathRecord;
use rdma_types::WcStatus;
use rdma_types::{AccessFlags, Gid, Guid, Lid, Mtu, Pkey, PortNum, Psn, QpState, Qpn, WcOpcode};
use rnic::softroce::{Personality, SoftCa, SoftRoce, ROCE_PORT};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use verbs::{
    AhAttr, CqHandle, CqInit, MemBuf, MrInfo, PortState, Provider, QpAttr, QpHandle, QpInit,
    RecvWr, SendOpcode, SendWr, Sge, WorkCompletion,
};

const T: Duration = Duration::from_secs(10);

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 131, last))
}

fn guid(last: u8) -> Guid {
    Guid(0x1310_0000 | u64::from(last))
}

/// `ib` nodes at 127.0.131.`lasts`, on one provider.
fn nodes(lasts: &[u8]) -> (Arc<SoftRoce>, Vec<IbNode>) {
    let p = SoftRoce::new(
        lasts
            .iter()
            .map(|&l| SoftCa {
                guid: guid(l),
                ip: ip(l),
            })
            .collect(),
        ROCE_PORT,
    );
    let nodes = lasts
        .iter()
        .map(|&l| {
            common::ib_node(
                p.clone(),
                guid(l),
                &format!("node-{l}"),
                false,
                u32::from(l) << 16,
            )
            .unwrap()
        })
        .collect();
    (p, nodes)
}

/// An RC QP with a registered buffer, in INIT.
struct Rc {
    p: Arc<SoftRoce>,
    cq: CqHandle,
    qp: QpHandle,
    buf: MemBuf,
    mr: MrInfo,
}

impl Rc {
    /// On `node`, sending with the P_Key at `pkey_index` of its table.
    fn new(p: &Arc<SoftRoce>, node: &IbNode, pkey_index: u16) -> Rc {
        let dev = p
            .open_ca(node.guid(), 0, Arc::new(verbs::IgnoreEvents))
            .unwrap();
        let pd = p.alloc_pd(dev, 0).unwrap();
        let cq = p.create_cq(pd, &CqInit { cqe: 8 }, 0).unwrap();
        let mut init = QpInit::rc(cq, 4, 4);
        init.sq_sig_all = true;
        let qp = p.create_qp(pd, &init, 0).unwrap();
        p.modify_qp(
            qp,
            &QpAttr {
                state: Some(QpState::Init),
                port: Some(PortNum(1)),
                pkey_index: Some(pkey_index),
                access: Some(AccessFlags::LOCAL_WRITE),
                ..Default::default()
            },
        )
        .unwrap();
        let buf = MemBuf::new(4096);
        let mr = p
            .reg_mr(
                pd,
                &buf,
                buf.addr(),
                buf.len() as u64,
                AccessFlags::LOCAL_WRITE,
                0,
            )
            .unwrap();
        Rc {
            p: p.clone(),
            cq,
            qp,
            buf,
            mr,
        }
    }

    fn qpn(&self) -> Qpn {
        self.p.qp_num(self.qp).unwrap()
    }

    /// RTR then RTS along `path` (its DGID and DLID, its MTU).
    fn connect(&self, path: &PathRecord, remote_qpn: Qpn, rq_psn: Psn, sq_psn: Psn) {
        self.connect_with(path, remote_qpn, rq_psn, sq_psn, 14, 7);
    }

    /// As `connect`, with the local ACK timeout code and retry count.
    fn connect_with(
        &self,
        path: &PathRecord,
        remote_qpn: Qpn,
        rq_psn: Psn,
        sq_psn: Psn,
        timeout: u8,
        retry_cnt: u8,
    ) {
        let mut av = AhAttr::roce(path.dgid);
        av.dlid = Lid(path.dlid);
        av.sl = path.sl;
        let p = &self.p;
        p.modify_qp(
            self.qp,
            &QpAttr {
                state: Some(QpState::Rtr),
                av: Some(av),
                path_mtu: Some(Mtu::from_code(path.mtu).unwrap_or(Mtu::Mtu1024)),
                dest_qpn: Some(remote_qpn),
                rq_psn: Some(rq_psn),
                max_dest_rd_atomic: Some(1),
                min_rnr_timer: Some(12),
                ..Default::default()
            },
        )
        .unwrap();
        p.modify_qp(
            self.qp,
            &QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(sq_psn),
                timeout: Some(timeout),
                retry_cnt: Some(retry_cnt),
                rnr_retry: Some(7),
                max_rd_atomic: Some(1),
                ..Default::default()
            },
        )
        .unwrap();
    }

    fn sge(&self, len: u32) -> Sge {
        Sge {
            addr: self.buf.addr(),
            length: len,
            lkey: self.mr.lkey,
        }
    }

    fn wc(&self) -> WorkCompletion {
        let end = Instant::now() + T;
        let mut wc = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0)];
        loop {
            if self.p.poll_cq(self.cq, &mut wc).unwrap() == 1 {
                return wc[0];
            }
            assert!(Instant::now() < end, "no completion");
            let _ = self.p.wait_cq(self.cq, Duration::from_millis(50));
        }
    }
}

fn one_path(sa: &SaClient, from: Gid, to: Gid) -> PathRecord {
    let paths = sa
        .path_records(&PathQuery {
            sgid: from,
            dgid: to,
            max_paths: 1,
            pkey: None,
            service_id: None,
        })
        .unwrap();
    assert_eq!(paths.len(), 1, "{paths:?}");
    paths[0]
}

#[test]
fn ibsm_run_brings_ib_nodes_up_and_serves_paths_connections_and_traps() {
    let (p, n) = nodes(&[2, 3]);
    for x in &n {
        let port = x.port().unwrap();
        assert_eq!((port.state, port.lid), (PortState::Init, Lid(0)));
    }
    let mut sm = Ibsm::start(
        "run",
        &[
            "--addr",
            "127.0.131.1",
            "--node",
            "127.0.131.2",
            "--node",
            "127.0.131.3",
            "--sweep-interval-ms",
            "300",
            "--timeout-ms",
            "100",
            "--retries",
            "2",
        ],
    );
    let started = Instant::now();
    for x in &n {
        assert!(
            x.sma().wait_state(state::ACTIVE, T),
            "node {:#x} not ACTIVE",
            x.guid().0
        );
    }
    // The SA lists a port once the SM has finished with it (P_Key table
    // set, trap 64), a few SMPs after the port went ACTIVE.
    sm.wait_output(T, |out| out.matches(" ACTIVE, LID ").count() == 2);
    eprintln!(
        "ibsm run: 2 nodes ACTIVE and in service {} ms after the SM started",
        started.elapsed().as_millis()
    );
    let (a, b) = (&n[0], &n[1]);
    let (la, lb) = (a.sma().lid(), b.sma().lid());
    assert!(la > 1 && lb > 1 && la != lb, "LIDs {la} {lb}");
    for x in &n {
        let port = x.port().unwrap();
        assert_eq!(
            (port.state, port.lid, port.sm_lid),
            (PortState::Active, Lid(x.sma().lid()), Lid(1))
        );
    }
    let sa_gid = Gid::from_ip(ip(1));
    assert_eq!(a.sma().sm_gid(), Some(sa_gid), "the SA is where the SM is");

    // The SA: paths both ways, carrying the GIDs and the LIDs.
    let timing = SaTiming::default();
    let sa_a = SaClient::new(a.agent(), sa_gid, timing).unwrap();
    let sa_b = SaClient::new(b.agent(), sa_gid, timing).unwrap();
    let ab = one_path(&sa_a, a.agent().gid(), b.agent().gid());
    assert_eq!(
        (ab.sgid, ab.dgid, ab.slid, ab.dlid, ab.pkey.0),
        (a.agent().gid(), b.agent().gid(), la, lb, 0xffff)
    );
    let ba = one_path(&sa_b, b.agent().gid(), a.agent().gid());
    assert_eq!((ba.dgid, ba.dlid), (a.agent().gid(), la));
    let mut lids: Vec<u16> = sa_a
        .node_records(None)
        .unwrap()
        .iter()
        .map(|r| r.lid)
        .collect();
    lids.sort_unstable();
    let mut want = vec![la, lb];
    want.sort_unstable();
    assert_eq!(lids, want);

    // An RC connection by the IB CM along those paths.
    const SID: u64 = 0x0131_0000_0000_0001;
    let (qa, qb) = (Rc::new(&p, a, 0), Rc::new(&p, b, 0));
    qb.p.post_recv(
        qb.qp,
        &[RecvWr {
            wr_id: 7,
            sges: verbs::sges![qb.sge(64)],
        }],
    )
    .unwrap();
    let requests = b.agent().listen(SID);
    let (psn_a, psn_b) = (Psn::new(0x100), Psn::new(0x200));
    let server = {
        let qbn = qb.qpn();
        std::thread::spawn(move || {
            let inc = requests.recv_timeout(T).expect("a REQ");
            (inc.remote_qpn, inc.remote_psn, inc, qbn)
        })
    };
    let client = {
        let agent = a.agent().clone();
        let (dgid, qan) = (ab.dgid, qa.qpn());
        std::thread::spawn(move || agent.connect(dgid, SID, qan, psn_a, b"ib".to_vec(), T))
    };
    let (rq, rpsn, inc, qbn) = server.join().unwrap();
    assert_eq!((rq, rpsn), (qa.qpn(), psn_a));
    qb.connect(&ba, rq, psn_b, rpsn);
    assert!(inc.accept(qbn, psn_b, b"ok".to_vec()));
    let est = client.join().unwrap().unwrap();
    assert_eq!((est.remote_qpn, est.remote_psn), (qb.qpn(), psn_b));
    qa.connect(&ab, est.remote_qpn, psn_a, est.remote_psn);
    qa.buf.write_at(0, b"over a path from the SA");
    let mut w = SendWr::new(1, SendOpcode::Send, vec![qa.sge(23)]);
    w.flags = verbs::SendFlags::SIGNALED;
    qa.p.post_send(qa.qp, &[w]).unwrap();
    let wc = qb.wc();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (7, WcStatus::Success, 23)
    );
    assert_eq!(qb.buf.to_vec(0, 23), b"over a path from the SA".to_vec());
    assert_eq!(qa.wc().status, WcStatus::Success);

    // A node whose cable is pulled: trap 65 to the subscriber; the port
    // is down, and its SMA back in INIT.
    sa_a.subscribe(65).unwrap();
    sa_a.subscribe(64).unwrap();
    let notices = sa_a.notices().unwrap();
    p.set_port_active(b.guid(), false).unwrap();
    assert_eq!(b.port().unwrap().state, PortState::Down);
    assert_eq!(b.sma().port_state(), state::INIT);
    let (from, notice) = notices.recv_timeout(T).expect("trap 65");
    assert_eq!((from, notice.trap_number), (sa_gid, 65));
    assert_eq!(&notice.data_details[6..22], &b.agent().gid().0[..]);
    // The cable back: INIT until the SM's next sweep makes the port
    // ACTIVE again, with the LID it had; trap 64.
    p.set_port_active(b.guid(), true).unwrap();
    let (_, notice) = notices.recv_timeout(T).expect("trap 64");
    assert_eq!(notice.trap_number, 64);
    assert_eq!(&notice.data_details[6..22], &b.agent().gid().0[..]);
    assert_eq!((b.sma().port_state(), b.sma().lid()), (state::ACTIVE, lb));
    let port = b.port().unwrap();
    assert_eq!((port.state, port.lid), (PortState::Active, Lid(lb)));

    let (ok, out) = sm.terminate(T);
    assert!(ok, "{out}");
    assert!(out.contains(&format!("{:#018x} gone", b.guid().0)), "{out}");
    assert_eq!(
        out.matches(" ACTIVE, LID ").count(),
        3,
        "b came back: {out}"
    );
    assert!(out.contains("signal 15, stopping"), "{out}");
}

#[test]
fn ibsm_run_once_gives_a_verdict() {
    let (_p, n) = nodes(&[4]);
    let args = |extra: &'static str| {
        let mut v = vec![
            "--addr",
            "127.0.131.5",
            "--node",
            "127.0.131.4",
            "--timeout-ms",
            "50",
            "--retries",
            "1",
            "--once",
        ];
        if !extra.is_empty() {
            v.extend(["--node", extra]);
        }
        v
    };
    // Nobody answers at .6: the sweep ends, the verdict fails.
    let (ok, out) = Ibsm::start("once-fail", &args("127.0.131.6")).wait(T);
    assert!(!ok, "{out}");
    assert!(out.contains("1 of 2 nodes did not come up"), "{out}");
    assert_eq!(n[0].sma().port_state(), state::ACTIVE, "{out}");
    // The node from a file this time, with a comment and a repeat.
    let dir = std::env::temp_dir().join(format!("ibsm-nodes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good");
    std::fs::write(
        &good,
        "# the fabric\n127.0.131.4  # node 4\n\n127.0.131.4\n",
    )
    .unwrap();
    let mut a = args("");
    a.retain(|x| !x.starts_with("127.0.131.4") && *x != "--node");
    let good_s = good.display().to_string();
    a.extend(["--nodes-file", &good_s]);
    let (ok, out) = Ibsm::start("once-ok", &a).wait(T);
    assert!(ok, "{out}");
    assert!(
        out.contains("ibsm: SM and SA at 127.0.131.5 (LID 1), 1 nodes"),
        "{out}"
    );
    assert!(out.contains("1 of 1 ports ACTIVE after 1 sweeps"), "{out}");
    let mut a = args("");
    a.retain(|x| *x != "--once");
    a.extend(["--sweeps", "3", "--sweep-interval-ms", "20"]);
    let (ok, out) = Ibsm::start("sweeps", &a).wait(T);
    assert!(ok, "{out}");
    // It stops at the first idle moment once 3 sweeps have started (a
    // slow machine may have started a 4th by then).
    let sweeps: u32 = out
        .split("1 of 1 ports ACTIVE after ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!((3..=4).contains(&sweeps), "{out}");
    let bad = dir.join("bad");
    std::fs::write(&bad, "127.0.131.4\n127.0.131.x\n").unwrap();
    let bad_s = bad.display().to_string();
    let (ok, out) = Ibsm::start(
        "once-badfile",
        &["--addr", "127.0.131.5", "--nodes-file", &bad_s],
    )
    .wait(T);
    assert!(
        !ok && out.contains(&format!("{bad_s}:2: \"127.0.131.x\"")),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    // Bad input is an error, not a panic.
    let (ok, out) = Ibsm::start(
        "once-bad",
        &["--addr", "127.0.131.5", "--node", "127.0.131.5"],
    )
    .wait(T);
    assert!(!ok && out.contains("the SM's own address"), "{out}");
}

/// Steps `port` on a thread until the flag is set (or 30 s pass); the
/// thread hands the port back.
fn drive(mut port: SmPort) -> (Arc<AtomicBool>, std::thread::JoinHandle<SmPort>) {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let t = std::thread::spawn(move || {
        let end = Instant::now() + 3 * T;
        while !s.load(Ordering::Relaxed) && Instant::now() < end {
            port.step(Duration::from_millis(20));
        }
        port
    });
    (stop, t)
}

/// The SM in-process ([`SmPort`] stepped by a thread) with a partitions
/// file: P_Key tables reach the ports, the SA gives a path only where a
/// full member is at one end, and every MAD the SM's port carried decodes
/// in tshark as the SMP and SA classes and attributes we meant.
#[test]
fn sm_port_sets_partitions_and_its_traffic_decodes_in_tshark() {
    let sm_guid = guid(21);
    let p = SoftRoce::new(
        [21, 22, 23, 24]
            .iter()
            .map(|&l| SoftCa {
                guid: guid(l),
                ip: ip(l),
            })
            .collect(),
        ROCE_PORT,
    );
    let n: Vec<IbNode> = [22u8, 23, 24]
        .iter()
        .map(|&l| common::ib_node(p.clone(), guid(l), "n", false, u32::from(l) << 16).unwrap())
        .collect();
    p.set_personality(sm_guid, Personality::Ib).unwrap();
    let mut cfg = SmConfig::new(sm_guid);
    cfg.partitions = ib_sm::parse_partitions(&format!(
        "Default=0x7fff : ALL=limited ;\nstorage=0x0010 : {:#x}=full, {:#x} ;\n",
        guid(22).0,
        guid(23).0
    ))
    .unwrap();
    cfg.sweep_interval = rdma_types::Duration::from_secs(60);
    let gids: Vec<Gid> = [22, 23, 24].iter().map(|&l| Gid::from_ip(ip(l))).collect();
    let mut port = SmPort::open(p.clone(), sm_guid, cfg, &gids).unwrap();
    assert!(
        SmPort::open(p.clone(), sm_guid, SmConfig::new(sm_guid), &gids).is_err(),
        "one SM per port: QP0 and QP1 are taken"
    );
    let sa_gid = port.gid();
    port.keep_log();
    let (stop, driver) = drive(port);
    // P_Key tables as the partitions say (limited members without the
    // membership bit), once the ports are ACTIVE.
    let tables = [
        vec![Pkey(0x7fff), Pkey(0x8010)],
        vec![Pkey(0x7fff), Pkey(0x0010)],
        vec![Pkey(0x7fff)],
    ];
    let sa = SaClient::new(n[0].agent(), sa_gid, SaTiming::default()).unwrap();
    // The SA lists a port once the SM finished with it (its P_Key table
    // set); the NodeRecord table says when all three are there.
    let end = Instant::now() + T;
    while sa.node_records(None).unwrap().len() < 3 {
        assert!(Instant::now() < end, "the SA never listed the 3 nodes");
        std::thread::sleep(Duration::from_millis(20));
    }
    for (x, want) in n.iter().zip(&tables) {
        assert_eq!(x.sma().port_state(), state::ACTIVE);
        assert_eq!(&x.port().unwrap().pkeys, want, "node {:#x}", x.guid().0);
    }
    let g = |i: usize| n[i].agent().gid();
    let path = |a: usize, b: usize| {
        sa.path_records(&PathQuery {
            sgid: g(a),
            dgid: g(b),
            max_paths: 1,
            pkey: None,
            service_id: None,
        })
        .unwrap()
    };
    let p01 = path(0, 1);
    assert_eq!(p01.len(), 1);
    assert_eq!(p01[0].pkey, Pkey(0x8010), "only storage has a full member");
    assert!(path(1, 2).is_empty(), "two limited members: no path");
    assert!(
        path(0, 2).is_empty(),
        "no shared partition with a full member"
    );
    // The partitions on the data path: an RC pair in storage (a full and
    // a limited member, P_Key index 1) talks; two limited members of the
    // default partition (index 0) do not, whatever the path says.
    let send = |from: usize, to: usize, ix: u16, path: &PathRecord| {
        let (qa, qb) = (Rc::new(&p, &n[from], ix), Rc::new(&p, &n[to], ix));
        let rwr = RecvWr {
            wr_id: 9,
            sges: verbs::sges![qb.sge(64)],
        };
        qb.p.post_recv(qb.qp, &[rwr]).unwrap();
        let mut back = *path;
        back.dgid = path.sgid;
        back.dlid = path.slid;
        let psn = Psn::new(1);
        qb.connect_with(&back, qa.qpn(), psn, psn, 10, 1);
        qa.connect_with(path, qb.qpn(), psn, psn, 10, 1);
        let mut w = SendWr::new(1, SendOpcode::Send, vec![qa.sge(8)]);
        w.flags = verbs::SendFlags::SIGNALED;
        qa.p.post_send(qa.qp, &[w]).unwrap();
        let status = qa.wc().status;
        let got = if status == WcStatus::Success {
            qb.wc().byte_len
        } else {
            let mut wc = [WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0)];
            assert_eq!(qb.p.poll_cq(qb.cq, &mut wc).unwrap(), 0, "{:?}", wc[0]);
            0
        };
        (status, got)
    };
    assert_eq!(send(0, 1, 1, &p01[0]), (WcStatus::Success, 8));
    let mut p12 = p01[0];
    (p12.sgid, p12.slid) = (g(1), p01[0].dlid);
    p12.dgid = g(2);
    p12.dlid = n[2].sma().lid();
    assert_eq!(send(1, 2, 0, &p12), (WcStatus::RetryExcErr, 0));
    let pir = sa.port_info_records(None, None).unwrap();
    assert_eq!(pir.len(), 3);
    sa.subscribe(65).unwrap();
    stop.store(true, Ordering::Relaxed);
    let mut port = driver.join().unwrap();
    assert_eq!(port.sm().active_ports().len(), 3);
    let st = port.stats();
    assert_eq!(st.misrouted, 0);

    // tshark on every MAD the SM port carried.
    let log = port.take_log();
    assert_eq!(
        log.iter().filter(|l| l.sent).count() as u64,
        st.sent,
        "{st:?}"
    );
    // tshark does not reassemble RMPP: a segment of a multi-MAD table
    // decodes with "trailing stray characters" (fabric.rs checks those
    // apart); the rest must decode clean.
    let multi = |m: &[u8; 256]| {
        rdma_mad::rmpp::RmppHeader::parse(m).is_ok_and(|h| h.active() && h.flags & 0x6 != 0x6)
    };
    let (segments, log): (Vec<_>, Vec<_>) = log.into_iter().partition(|l| multi(&l.mad));
    assert!(segments.len() >= 2, "the NodeRecord table took 2 segments");
    let frames: Vec<Vec<u8>> = log
        .iter()
        .enumerate()
        .map(|(i, l)| rdma_testkit::mad_frame(l.qp, &l.mad, i as u32))
        .collect();
    let file = std::env::temp_dir().join(format!("ibsm-port-{}.pcap", std::process::id()));
    std::fs::write(&file, rdma_testkit::pcap(&frames)).unwrap();
    let rows = rdma_testkit::tshark_fields(
        "sm_port_sets_partitions_and_its_traffic_decodes_in_tshark",
        &file,
        &[],
        &["infiniband.mad.mgmtclass", "infiniband.mad.attributeid"],
    );
    let _ = std::fs::remove_file(&file);
    let Some(rows) = rows else { return };
    assert_eq!(rows.len(), log.len());
    let seen: std::collections::BTreeSet<(String, String)> = rows
        .into_iter()
        .map(|r| (r[0].clone(), r[1].clone()))
        .collect();
    for want in [
        ("0x81", "0x0011"), // DR SMP NodeInfo
        ("0x81", "0x0010"), // NodeDescription
        ("0x81", "0x0015"), // PortInfo
        ("0x81", "0x0016"), // P_KeyTable
        ("0x03", "0x0035"), // SA PathRecord
        ("0x03", "0x0011"), // NodeRecord
        ("0x03", "0x0012"), // PortInfoRecord
        ("0x03", "0x0003"), // InformInfo
    ] {
        assert!(
            seen.contains(&(want.0.to_string(), want.1.to_string())),
            "tshark did not show class {} attribute {}: {seen:?}",
            want.0,
            want.1
        );
    }
}

/// Discovery as `srp_daemon` does it on a managed subnet: the SA's
/// PortInfoRecords with IsDeviceManagementSupported name the target's
/// LID, a PathRecord to that DLID gives its GID (over UDP the GID is what
/// reaches it), and the DM walk there finds the SRP I/O controller.
#[test]
fn srp_daemon_style_discovery_through_the_sa() {
    let (sm_guid, target, initiator) = (guid(31), guid(32), guid(33));
    let p = SoftRoce::new(
        [31, 32, 33]
            .iter()
            .map(|&l| SoftCa {
                guid: guid(l),
                ip: ip(l),
            })
            .collect(),
        ROCE_PORT,
    );
    let t = common::ib_node(p.clone(), target, "target", true, 0x32 << 16).unwrap();
    let i = common::ib_node(p.clone(), initiator, "initiator", false, 0x33 << 16).unwrap();
    let dm = rdma_access::dm::DmService::start(t.agent()).unwrap();
    let ioc = rdma_access::dm::Ioc::srp(target, &Default::default(), "ib-mode target");
    let _slot = dm.register_ioc(ioc.clone()).unwrap();
    p.set_personality(sm_guid, Personality::Ib).unwrap();
    let gids = [Gid::from_ip(ip(32)), Gid::from_ip(ip(33))];
    let port = SmPort::open(p.clone(), sm_guid, SmConfig::new(sm_guid), &gids).unwrap();
    let sa_gid = port.gid();
    let (stop, driver) = drive(port);
    assert!(t.sma().wait_state(state::ACTIVE, T));
    assert!(i.sma().wait_state(state::ACTIVE, T));
    let sa = SaClient::new(i.agent(), sa_gid, SaTiming::default()).unwrap();
    let dm_cap = rdma_mad::smp::cap::IS_DEVICE_MGMT_SUPPORTED;
    // The SA lists ports once the SM finished with them.
    let end = Instant::now() + T;
    let recs = loop {
        let r = sa.port_info_records(None, Some(dm_cap)).unwrap();
        if !r.is_empty() {
            break r;
        }
        assert!(Instant::now() < end, "no port with device management");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(recs.len(), 1, "only the target offers device management");
    assert_eq!(recs[0].lid, t.sma().lid());
    // PathRecord by DLID (SGID ours), as srp_daemon asks.
    let mut q = [0u8; PathRecord::LEN];
    let mut rec = PathRecord::parse(&q).unwrap();
    rec.sgid = i.agent().gid();
    rec.dlid = recs[0].lid;
    rec.emit(&mut q);
    let mask = rdma_access::sa::path_comp::SGID | rdma_access::sa::path_comp::DLID;
    let req = rdma_access::sa::sa_request(
        rdma_mad::mad::Method::Get,
        rdma_mad::sa::SaAttr::PathRecord,
        mask,
        &q,
    );
    let asker = i
        .agent()
        .mad_agent(rdma_access::sa::SA_CLASS, 2, &[])
        .unwrap();
    let resp = asker
        .request_long(sa_gid, req, Duration::from_millis(300), 3)
        .unwrap();
    let paths = rdma_access::sa::records(&resp, PathRecord::LEN).unwrap();
    assert_eq!(paths.len(), 1);
    let path = PathRecord::parse(&paths[0]).unwrap();
    assert_eq!(path.dgid, t.agent().gid());
    // The DM walk at that GID.
    let found =
        rdma_access::dm::query_iocs(i.agent(), path.dgid, Duration::from_millis(300), 3).unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].1, ioc);
    stop.store(true, Ordering::Relaxed);
    driver.join().unwrap();
}
