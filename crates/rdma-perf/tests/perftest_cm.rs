//! `rperftest -R` (perftest's RDMA CM mode) client against `rperftest -R`
//! server, two processes on 127.95.x.y, over our soft iWARP NIC and our
//! soft RoCE NIC: WRITE and READ (and SEND over iWARP), the data checked
//! exactly, both sides' bandwidth lines read back. Then peers that break
//! the exchange on the RDMA CM connection (a message of the wrong size,
//! a peer that disconnects halfway), built here from the same NIC, CM
//! and verbs: each ends in a clear error within the timeout, never a
//! hang or a panic.

use rdma_perf::device::{Nic, NicChoice};
use rdma_types::{AccessFlags, Gid, Mtu, Psn, QpState, WcStatus};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use verbs::{CqInit, MemBuf, QpAttr, QpInit, RecvWr, SendOpcode, SendWr, Sge, WorkCompletion};

fn rperftest() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rperftest"))
}

/// Starts a server and waits until it listens (the banner follows the
/// listen).
fn server(args: &[&str]) -> (Child, std::io::Lines<BufReader<std::process::ChildStdout>>) {
    let mut child = rperftest()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    loop {
        let l = lines
            .next()
            .expect("server ended before listening")
            .unwrap();
        if l.contains("Waiting for client") {
            break;
        }
    }
    (child, lines)
}

/// Waits for a child with a deadline; returns its output.
fn finish(mut child: Child, secs: u64) -> Output {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("process did not end in {secs} s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The result line for `size` x `iters` in `out`, its average above 0.
fn bw_line(out: &str, size: &str, iters: &str) -> f64 {
    let line = out
        .lines()
        .find(|l| l.split_whitespace().take(2).eq([size, iters]))
        .unwrap_or_else(|| panic!("no result line for {size} x {iters}:\n{out}"));
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(f.len(), 5, "{line}");
    let avg: f64 = f[3].parse().unwrap();
    let rate: f64 = f[4].parse().unwrap();
    assert!(avg > 0.0 && rate > 0.0, "{line}");
    avg
}

/// One test both ways with -R; `nic` is `--iwarp` or the soft RoCE
/// NIC's UDP port.
fn both_ours(verb: &str, nic: &[&str], srv: &str, cli: &str, port: &str, expect: &[&str]) {
    let (size, iters) = ("4096", "300");
    let common = ["-R", "-p", port, "-s", size, "-n", iters, "--timeout", "20"];
    let mut sargs = vec![verb, "--bind", srv];
    sargs.extend(nic);
    sargs.extend(common);
    let (s, lines) = server(&sargs);
    let mut cargs = vec![verb, srv, "--bind", cli];
    cargs.extend(nic);
    cargs.extend(common);
    let client = rperftest().args(&cargs).output().unwrap();
    let out = text(&client.stdout);
    assert!(client.status.success(), "{out}{}", text(&client.stderr));
    let mine = bw_line(&out, size, iters);
    assert!(out.contains("peer 6.06 (rperftest)"), "{out}");
    assert!(
        out.contains(&format!("verified: {iters} completions")),
        "{out}"
    );
    let o = finish(s, 30);
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let all = rest.join("\n");
    assert!(o.status.success(), "{all}{}", text(&o.stderr));
    let theirs = bw_line(&all, size, iters);
    if verb != "send" {
        // A WRITE/READ server prints the client's report as it came.
        assert_eq!(mine, theirs, "{out}\n{all}");
    }
    for e in expect {
        assert!(
            out.contains(e) || all.contains(e),
            "missing {e:?}:\n{out}\n{all}"
        );
    }
}

#[test]
fn write_over_iwarp_with_rdma_cm_lands_the_clients_pattern() {
    both_ours(
        "write",
        &["--iwarp"],
        "127.95.0.1",
        "127.95.0.2",
        "18601",
        &["written slots hold the client's pattern; nothing else changed"],
    );
}

#[test]
fn read_over_iwarp_with_rdma_cm_brings_back_the_servers_pattern() {
    both_ours(
        "read",
        &["--iwarp"],
        "127.95.0.3",
        "127.95.0.4",
        "18602",
        &[
            "every READ brought back the server's pattern (300 x 4096 bytes)",
            "the READ source buffer was not written",
        ],
    );
}

#[test]
fn send_over_iwarp_with_rdma_cm_carries_the_clients_pattern() {
    both_ours(
        "send",
        &["--iwarp"],
        "127.95.0.5",
        "127.95.0.6",
        "18603",
        &["every SEND carried the client's pattern"],
    );
}

#[test]
fn write_and_read_over_soft_roce_with_rdma_cm() {
    both_ours(
        "write",
        &["--udp-port", "24901"],
        "127.95.0.7",
        "127.95.0.8",
        "18604",
        &["written slots hold the client's pattern; nothing else changed"],
    );
    both_ours(
        "read",
        &["--udp-port", "24902"],
        "127.95.0.9",
        "127.95.0.10",
        "18605",
        &["every READ brought back the server's pattern (300 x 4096 bytes)"],
    );
}

#[test]
fn atomics_and_latency_are_refused_with_rdma_cm() {
    let o = rperftest()
        .args(["atomic", "--iwarp", "--bind", "127.95.0.11", "-R"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(
        err.contains("-R (RDMA CM) works with write, read and send"),
        "{err}"
    );
}

#[test]
fn a_client_without_a_server_says_so_within_its_timeout() {
    let t = Instant::now();
    let o = rperftest()
        .args(["write", "127.95.0.13", "--iwarp", "--bind", "127.95.0.14"])
        .args(["-R", "-p", "18606", "--timeout", "5"])
        .output()
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(20));
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains("RDMA CM connect for the exchange to 127.95.0.13:18606"),
        "{err}"
    );
    assert!(err.contains("is the server running with -R"), "{err}");
}

/// A misbehaving peer: our iWARP NIC at `ip`, one RC QP on an RDMA CM
/// connection, SENDs and receives by hand.
struct Fake {
    nic: Nic,
    cm: Arc<dyn rdma_access::rdmacm::Service>,
    p: Arc<dyn verbs::Provider>,
    cq: verbs::CqHandle,
    qp: verbs::QpHandle,
    qpn: rdma_types::Qpn,
    mem: MemBuf,
    mr: verbs::MrInfo,
    conn: Option<rdma_access::ConnId>,
}

impl Fake {
    fn open(ip: &str) -> Fake {
        let nic = Nic::open(&NicChoice::Iwarp {
            ip: ip.parse().unwrap(),
            opts: iwarp_tcp::NicOptions::default(),
        })
        .unwrap();
        let (cm, _) = nic.rdma_cm(7 << 8).unwrap();
        let p = nic.provider().clone();
        let pd = p.alloc_pd(nic.ca(), 0).unwrap();
        let cq = p.create_cq(pd, &CqInit { cqe: 16 }, 0).unwrap();
        let qp = p.create_qp(pd, &QpInit::rc(cq, 4, 4), 0).unwrap();
        let mem = MemBuf::new(256);
        let mr = p
            .reg_mr(pd, &mem, mem.addr(), 256, AccessFlags::LOCAL_WRITE, 0)
            .unwrap();
        p.modify_qp(
            qp,
            &QpAttr {
                state: Some(QpState::Init),
                port: Some(nic.port()),
                pkey_index: Some(0),
                access: Some(AccessFlags::LOCAL_WRITE),
                ..Default::default()
            },
        )
        .unwrap();
        let qpn = p.qp_num(qp).unwrap();
        let f = Fake {
            nic,
            cm,
            p,
            cq,
            qp,
            qpn,
            mem,
            mr,
            conn: None,
        };
        f.post_recv();
        f
    }

    fn post_recv(&self) {
        self.p
            .post_recv(
                self.qp,
                &[RecvWr {
                    wr_id: 1,
                    sges: vec![Sge {
                        addr: self.mem.addr(),
                        length: 128,
                        lkey: self.mr.lkey,
                    }],
                }],
            )
            .unwrap();
    }

    fn rts(&self, peer: Gid, remote_qpn: rdma_types::Qpn, remote_psn: Psn) {
        self.p
            .modify_qp(
                self.qp,
                &QpAttr {
                    state: Some(QpState::Rtr),
                    av: Some(self.nic.av(peer)),
                    path_mtu: Some(Mtu::Mtu1024),
                    dest_qpn: Some(remote_qpn),
                    rq_psn: Some(Psn::new(1)),
                    max_dest_rd_atomic: Some(1),
                    min_rnr_timer: Some(12),
                    ..Default::default()
                },
            )
            .unwrap();
        self.p
            .modify_qp(
                self.qp,
                &QpAttr {
                    state: Some(QpState::Rts),
                    sq_psn: Some(remote_psn),
                    timeout: Some(14),
                    retry_cnt: Some(7),
                    rnr_retry: Some(7),
                    max_rd_atomic: Some(1),
                    ..Default::default()
                },
            )
            .unwrap();
    }

    /// Connects to `server` (listening already).
    fn connect(&mut self, from: &str, server: &str, port: u16) {
        let dst = SocketAddr::new(server.parse().unwrap(), port);
        let est = self
            .cm
            .connect(
                from.parse().unwrap(),
                dst,
                self.qpn,
                Psn::new(1),
                &[],
                Duration::from_secs(10),
            )
            .unwrap_or_else(|e| panic!("connect to {dst}: {e}"));
        self.rts(Gid::from_ip(dst.ip()), est.remote_qpn, est.remote_psn);
        self.conn = Some(est.conn);
    }

    /// Accepts the first request `rx` (our listener) brings.
    fn accept(&mut self, rx: &std::sync::mpsc::Receiver<rdma_access::rdmacm::Listened>) {
        let req = rx.recv_timeout(Duration::from_secs(20)).unwrap().unwrap();
        self.rts(req.peer, req.remote_qpn, req.remote_psn);
        self.conn = Some(req.conn);
        assert!(req.accept(self.qpn, Psn::new(1), Vec::new()));
    }

    fn next(&self) -> WorkCompletion {
        let mut wc = [WorkCompletion::new(
            0,
            WcStatus::Success,
            rdma_types::WcOpcode::Send,
            0,
        )];
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            if self.p.poll_cq(self.cq, &mut wc).unwrap() == 1 {
                assert_eq!(wc[0].status, WcStatus::Success);
                return wc[0];
            }
            assert!(Instant::now() < end, "no completion");
            let _ = self.p.req_notify_cq(self.cq, false);
            let _ = self.p.wait_cq(self.cq, Duration::from_millis(20));
        }
    }

    fn send(&self, m: &[u8]) {
        self.mem.write_at(128, m);
        self.p
            .post_send(
                self.qp,
                &[SendWr::new(
                    2,
                    SendOpcode::Send,
                    vec![Sge {
                        addr: self.mem.addr() + 128,
                        length: m.len() as u32,
                        lkey: self.mr.lkey,
                    }],
                )],
            )
            .unwrap();
        assert_eq!(self.next().wr_id, 2);
    }

    fn receive(&self) -> Vec<u8> {
        let c = self.next();
        assert_eq!(c.wr_id, 1);
        let m = self.mem.to_vec(0, c.byte_len as usize);
        self.post_recv();
        m
    }

    fn leave(&self) {
        if let Some(c) = self.conn {
            self.cm.disconnect(c);
        }
    }
}

fn version() -> Vec<u8> {
    let mut v = vec![0u8; 16];
    v[..4].copy_from_slice(b"6.06");
    v
}

fn no_panic(o: &Output) -> String {
    let err = text(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(!o.status.success());
    err
}

#[test]
fn a_message_of_the_wrong_size_is_refused_with_the_reason() {
    let (srv, _lines) = server(&[
        "write",
        "--iwarp",
        "--bind",
        "127.95.0.15",
        "-R",
        "-p",
        "18607",
        "--timeout",
        "10",
    ]);
    let mut f = Fake::open("127.95.0.16");
    f.connect("127.95.0.16", "127.95.0.15", 18607);
    // A version field must be 16 bytes.
    f.send(b"GET / HTTP/1.1\r\n\r\n");
    let o = finish(srv, 30);
    let err = no_panic(&o);
    assert!(
        err.contains("peer sent 18 bytes where 16 were due while swapping versions"),
        "{err}"
    );
    f.leave();
}

#[test]
fn a_server_that_leaves_mid_exchange_is_named() {
    let mut f = Fake::open("127.95.0.17");
    let port = 18608;
    let rx = f.cm.listen(port).unwrap();
    let client = std::thread::spawn(move || {
        rperftest()
            .args(["read", "127.95.0.17", "--iwarp", "--bind", "127.95.0.18"])
            .args(["-R", "-p", &port.to_string(), "--timeout", "10"])
            .output()
            .unwrap()
    });
    f.accept(&rx);
    // The client sends first; answer its version, then go.
    assert_eq!(&f.receive()[..5], b"6.06\0");
    f.send(&version());
    f.leave();
    let o = client.join().unwrap();
    let err = no_panic(&o);
    assert!(
        err.contains("peer closed the connection while swapping cycle buffer sizes"),
        "{err}"
    );
}

#[test]
fn a_client_that_leaves_mid_exchange_is_named() {
    let (srv, _lines) = server(&[
        "send",
        "--iwarp",
        "--bind",
        "127.95.0.19",
        "-R",
        "-p",
        "18609",
        "--timeout",
        "10",
    ]);
    let mut f = Fake::open("127.95.0.20");
    f.connect("127.95.0.20", "127.95.0.19", 18609);
    f.send(&version());
    assert_eq!(&f.receive()[..5], b"6.06\0");
    f.leave();
    let o = finish(srv, 30);
    let err = no_panic(&o);
    assert!(
        err.contains("peer closed the connection while swapping cycle buffer sizes"),
        "{err}"
    );
}
