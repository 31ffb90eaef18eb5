//! The `nicd` binary as users run it: a process serving an address on a
//! socket, clients of another process through it, and its end seen by
//! them as the CA's removal.

mod common;

use rdma_types::{Gid, PortNum, QpType, WcStatus};
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::sync::Arc;
use verbs::conformance::Node;
use verbs::conformance::{Ev, Recorder};
use verbs::{AsyncEventKind, Provider, RecvWr, SendOpcode, SendWr, VerbsError};

/// Kills the daemon should the test fail before it ends it.
struct Reap(i32);

impl Drop for Reap {
    fn drop(&mut self) {
        // SAFETY: a signal to our own child (a no-op once it is waited
        // for: the test then forgets this guard).
        unsafe { libc::kill(self.0, libc::SIGKILL) };
    }
}

/// `nicd --ip IP --socket SOCKET` started, once it says it serves.
fn start_nicd(ip: IpAddr, socket: &std::path::Path) -> (std::process::Child, Reap) {
    start_nicd_with(ip, socket, &[])
}

/// [`start_nicd`] with more arguments.
fn start_nicd_with(
    ip: IpAddr,
    socket: &std::path::Path,
    more: &[&str],
) -> (std::process::Child, Reap) {
    let mut nicd = Command::new(env!("CARGO_BIN_EXE_nicd"))
        .args(["--ip", &ip.to_string(), "--socket"])
        .arg(socket)
        .args(more)
        .env("SOFTROCE_FOLLOW_LINK", "0")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let reap = Reap(nicd.id() as i32);
    let mut line = String::new();
    BufReader::new(nicd.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with(&format!("nicd: serving {ip}")), "{line}");
    (nicd, reap)
}

/// What `nicd --clients` prints for the daemon at `socket` (it must
/// succeed).
fn clients_listed(socket: &std::path::Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_nicd"))
        .arg("--clients")
        .arg("--socket")
        .arg(socket)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn nicd_serves_a_client_and_its_end_removes_the_ca() {
    let ip = IpAddr::V4(Ipv4Addr::new(127, 27, 230, 1));
    let socket = std::env::temp_dir().join(format!("nicd-bin-{}.sock", std::process::id()));
    let (mut nicd, reap) = start_nicd(ip, &socket);

    let p = nicd::NicdProvider::connect(&socket).unwrap();
    assert_eq!(p.daemon_pid(), nicd.id());
    let guid = rnic::softroce::ip_guid(ip);
    assert_eq!(p.list_cas(), vec![guid]);
    let rec = Arc::new(Recorder::default());
    let ca = p.open_ca(guid, 5, rec.clone()).unwrap();
    let port = p.query_port(ca, PortNum(1)).unwrap();
    assert_eq!(port.gids[0], Gid::from_ip(ip));
    assert_eq!(p.query_ca(ca).unwrap().guid, guid);

    // A second daemon on the same address cannot have its UDP port: it
    // says so and stops, leaving no socket file; the first serves on.
    let socket2 = socket.with_extension("second");
    let out = Command::new(env!("CARGO_BIN_EXE_nicd"))
        .args(["--ip", &ip.to_string(), "--socket"])
        .arg(&socket2)
        .env("SOFTROCE_FOLLOW_LINK", "0")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("127.27.230.1 (UDP port 4791)"), "{err}");
    assert!(!socket2.exists());
    assert_eq!(p.query_ca(ca).unwrap().guid, guid);

    // `nicd --clients` lists this process's connection and what it holds
    // (its own connection too, holding nothing).
    let text = clients_listed(&socket);
    let me = format!(": pid {} uid ", std::process::id());
    let mine: Vec<&str> = text.lines().filter(|l| l.contains(&me)).collect();
    assert_eq!(mine.len(), 1, "{text}");
    assert!(mine[0].ends_with(": 1 CA"), "{text}");
    assert!(text.lines().any(|l| l.ends_with(": nothing")), "{text}");

    // SIGTERM: the daemon goes, its socket file with it; the client's
    // handler hears the CA removed and its verbs fail.
    // SAFETY: a signal to our own child, not yet waited for.
    unsafe { libc::kill(nicd.id() as i32, libc::SIGTERM) };
    assert!(nicd.wait().unwrap().success());
    std::mem::forget(reap);
    assert!(!socket.exists());
    assert!(rec.wait_for(|e| matches!(
        e,
        Ev::Async(a) if a.kind == AsyncEventKind::CaRemoval
    )));
    assert_eq!(p.query_ca(ca), Err(VerbsError::NoSuchCa));
    assert!(nicd::NicdProvider::connect(&socket).is_err());
}

/// `nicd --write-docs DIR` writes its man page (section 8, as the other
/// daemons'), and `dist/systemd/nicd.service` verifies with it in place.
/// The unit check is skipped without systemd-analyze (a failure in CI).
#[test]
fn nicd_has_a_man_page_and_its_unit_verifies() {
    let dir = std::env::temp_dir().join(format!("nicd-dist-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let docs = dir.join("docs");
    let out = Command::new(env!("CARGO_BIN_EXE_nicd"))
        .arg("--write-docs")
        .arg(&docs)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let page = std::fs::read_to_string(docs.join("man/man8/nicd.8")).unwrap();
    assert!(page.contains("NIC daemon"), "{page}");
    let unit = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist/systemd/nicd.service"),
    )
    .unwrap();
    assert!(unit.contains("--socket /run/nicd.sock"), "{unit}");
    if !rdma_testkit::need::tool("systemd-analyze") {
        return;
    }
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_nicd"));
    let here = format!("{}/", bin.parent().unwrap().display());
    let path = dir.join("nicd.service");
    std::fs::write(&path, unit.replace("/usr/local/sbin/", &here)).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .env("MANPATH", docs.join("man"))
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-analyze verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A running daemon takes a NIC at an address it was not started with
/// when a client (here the daemon's own user) asks: `connect_at` adds it,
/// an RC connection runs between the old NIC and the new, and an address
/// that is not this host's is refused in words and not listed.
#[test]
fn a_running_nicd_adds_the_nic_a_client_asks_for() {
    let a_ip = IpAddr::V4(Ipv4Addr::new(127, 27, 231, 1));
    let b_ip = IpAddr::V4(Ipv4Addr::new(127, 27, 231, 2));
    let socket = std::env::temp_dir().join(format!("nicd-add-{}.sock", std::process::id()));
    let (mut nicd, reap) = start_nicd(a_ip, &socket);

    let (pa, ga) = nicd::connect_at(&socket, a_ip, None).unwrap();
    assert_eq!(pa.list_cas(), vec![ga]);
    let (pb, gb) = nicd::connect_at(&socket, b_ip, None).unwrap();
    assert_eq!(gb, rnic::softroce::ip_guid(b_ip));
    assert_eq!(pa.list_cas(), vec![ga, gb]);
    // Asking again names the same NIC and adds none.
    assert_eq!(pa.add_nic(b_ip), Ok(gb));
    assert_eq!(pb.list_cas().len(), 2);

    // A SEND from the NIC it started with to the one it added.
    let a = Node::open(&common::One(pa.clone(), ga), ga, 64);
    let b = Node::open(&common::One(pb.clone(), gb), gb, 64);
    assert_eq!(b.av().dgid, Gid::from_ip(b_ip));
    let (qa, qb) = (a.qp(QpType::Rc, None, 1), b.qp(QpType::Rc, None, 2));
    common::rc_to(&a, qa, b.av(), b.p.qp_num(qb).unwrap());
    common::rc_to(&b, qb, a.av(), a.p.qp_num(qa).unwrap());
    b.p.post_recv(
        qb,
        &[RecvWr {
            wr_id: 7,
            sges: verbs::sges![b.sge(0, 64)],
        }],
    )
    .unwrap();
    a.buf.write_at(0, b"through a NIC added later");
    a.p.post_send(qa, &[SendWr::new(1, SendOpcode::Send, vec![a.sge(0, 25)])])
        .unwrap();
    assert_eq!(a.wc().status, WcStatus::Success);
    let got = b.wc();
    assert_eq!(
        (got.status, got.wr_id, got.byte_len),
        (WcStatus::Success, 7, 25)
    );
    let mut seen = [0u8; 25];
    b.buf.read_at(0, &mut seen);
    assert_eq!(&seen, b"through a NIC added later");

    // 192.0.2.1 (TEST-NET-1) is no address of this host: the NIC cannot
    // bind there, so the daemon refuses and lists it not.
    let far = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
    let err = nicd::connect_at(&socket, far, None).err().expect("refused");
    assert!(
        err.contains("serves no NIC at 192.0.2.1") && err.contains("would not add one"),
        "{err}"
    );
    assert_eq!(pa.list_cas(), vec![ga, gb]);

    drop((a, b));
    // SAFETY: a signal to our own child, not yet waited for.
    unsafe { libc::kill(nicd.id() as i32, libc::SIGTERM) };
    assert!(nicd.wait().unwrap().success());
    std::mem::forget(reap);
}

/// `nicd --fabric ib`: the daemon's port waits in INIT until a subnet
/// manager (here one on a soft RoCE port of this process) sweeps it, and
/// the daemon's SMA answers that SM on the port's QP0: the port comes
/// ACTIVE with the LID the SM gave, which a client reads.
#[test]
fn nicd_on_an_ib_fabric_serves_its_ports_sma() {
    use ib_sm::port::SmPort;
    use rnic::softroce::{NicOptions, Personality, SoftCa, SoftRoce, ROCE_PORT};
    use std::time::{Duration, Instant};
    let sm_ip = IpAddr::V4(Ipv4Addr::new(127, 27, 232, 1));
    let ip = IpAddr::V4(Ipv4Addr::new(127, 27, 232, 2));
    let socket = std::env::temp_dir().join(format!("nicd-ib-{}.sock", std::process::id()));
    let (mut nicd, reap) = start_nicd_with(ip, &socket, &["--fabric", "ib"]);

    let p = nicd::NicdProvider::connect(&socket).unwrap();
    let guid = rnic::softroce::ip_guid(ip);
    let ca = p.open_ca(guid, 0, Arc::new(verbs::IgnoreEvents)).unwrap();
    let port = p.query_port(ca, PortNum(1)).unwrap();
    assert_eq!(port.state, verbs::PortState::Init, "{port:?}");

    let options = NicOptions {
        follow_link: false,
        ..NicOptions::default()
    };
    let sm_nic = SoftRoce::with_options(
        vec![SoftCa::at(sm_ip)],
        ROCE_PORT,
        rdma_types::Mtu::Mtu4096,
        options,
    );
    let sm_guid = rnic::softroce::ip_guid(sm_ip);
    sm_nic.set_personality(sm_guid, Personality::Ib).unwrap();
    let mut sm = SmPort::open(
        sm_nic.clone(),
        sm_guid,
        ib_sm::SmConfig::new(sm_guid),
        &[Gid::from_ip(ip)],
    )
    .unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    let port = loop {
        sm.step(Duration::from_millis(20));
        let port = p.query_port(ca, PortNum(1)).unwrap();
        if port.state == verbs::PortState::Active {
            break port;
        }
        assert!(Instant::now() < end, "never ACTIVE: {port:?}");
    };
    assert_ne!(port.lid, rdma_types::Lid(0), "{port:?}");

    drop(sm);
    // SAFETY: a signal to our own child, not yet waited for.
    unsafe { libc::kill(nicd.id() as i32, libc::SIGTERM) };
    assert!(nicd.wait().unwrap().success());
    std::mem::forget(reap);
}

/// A subnet manager through the daemon (a privileged client's SmPort on
/// the daemon's port A) borrows A's QP0 from the daemon's SMA, brings
/// the daemon's port B ACTIVE through B's SMA, and when it goes the SMA
/// of A has its QP0 back: an SM elsewhere then gives A a LID of its own.
#[test]
fn a_subnet_manager_through_nicd_borrows_its_ports_qp0() {
    use ib_sm::port::SmPort;
    use rnic::softroce::{NicOptions, Personality, SoftCa, SoftRoce, ROCE_PORT};
    use std::time::{Duration, Instant};
    let a_ip = IpAddr::V4(Ipv4Addr::new(127, 27, 233, 1));
    let b_ip = IpAddr::V4(Ipv4Addr::new(127, 27, 233, 2));
    let c_ip = IpAddr::V4(Ipv4Addr::new(127, 27, 233, 3));
    let socket = std::env::temp_dir().join(format!("nicd-sm-{}.sock", std::process::id()));
    let (mut nicd, reap) = start_nicd_with(
        a_ip,
        &socket,
        &["--fabric", "ib", "--ip", &b_ip.to_string()],
    );
    let (ga, gb) = (rnic::softroce::ip_guid(a_ip), rnic::softroce::ip_guid(b_ip));

    let p = nicd::NicdProvider::connect(&socket).unwrap();
    let ca = p.open_ca(ga, 0, Arc::new(verbs::IgnoreEvents)).unwrap();
    let cb = p.open_ca(gb, 0, Arc::new(verbs::IgnoreEvents)).unwrap();
    let provider: Arc<dyn Provider> = p.clone();
    let mut sm = SmPort::open(
        provider,
        ga,
        ib_sm::SmConfig::new(ga),
        &[Gid::from_ip(b_ip)],
    )
    .unwrap();
    // The SM's own port is configured directly, as `ibsm run` does.
    let own = verbs::PortModify::new()
        .lid(rdma_types::Lid(1))
        .sm_lid(rdma_types::Lid(1))
        .state(verbs::PortState::Active);
    p.modify_port(ca, PortNum(1), &own).unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    let port = loop {
        sm.step(Duration::from_millis(20));
        let port = p.query_port(cb, PortNum(1)).unwrap();
        if port.state == verbs::PortState::Active {
            break port;
        }
        assert!(Instant::now() < end, "B never ACTIVE: {port:?}");
    };
    assert_ne!(port.lid, rdma_types::Lid(0), "{port:?}");
    assert_eq!(port.sm_lid, rdma_types::Lid(1), "{port:?}");
    drop(sm);

    // The SMA of A is back: an SM at C (LID 1 its own) sweeps A and gives
    // it another LID.
    let options = NicOptions {
        follow_link: false,
        ..NicOptions::default()
    };
    let c_nic = SoftRoce::with_options(
        vec![SoftCa::at(c_ip)],
        ROCE_PORT,
        rdma_types::Mtu::Mtu4096,
        options,
    );
    let gc = rnic::softroce::ip_guid(c_ip);
    c_nic.set_personality(gc, Personality::Ib).unwrap();
    let mut sm_c = SmPort::open(
        c_nic.clone(),
        gc,
        ib_sm::SmConfig::new(gc),
        &[Gid::from_ip(a_ip)],
    )
    .unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        sm_c.step(Duration::from_millis(20));
        let port = p.query_port(ca, PortNum(1)).unwrap();
        if port.lid != rdma_types::Lid(1) && port.lid != rdma_types::Lid(0) {
            break;
        }
        assert!(
            Instant::now() < end,
            "A's SMA never answered C's SM: {port:?}"
        );
    }

    drop(sm_c);
    // SAFETY: a signal to our own child, not yet waited for.
    unsafe { libc::kill(nicd.id() as i32, libc::SIGTERM) };
    assert!(nicd.wait().unwrap().success());
    std::mem::forget(reap);
}

/// `nicd --clients` shows which client runs its own QPs on which NIC's
/// shared port, and `--no-shared-ports` lends none (the client's QPs then
/// stay in the daemon).
#[test]
fn nicd_clients_names_the_members_it_lent_and_no_shared_ports_lends_none() {
    for shared in [true, false] {
        let ip = IpAddr::V4(Ipv4Addr::new(127, 27, 230, if shared { 7 } else { 8 }));
        let socket =
            std::env::temp_dir().join(format!("nicd-lent-{}-{shared}.sock", std::process::id()));
        let more: &[&str] = if shared { &[] } else { &["--no-shared-ports"] };
        let (mut nicd, reap) = start_nicd_with(ip, &socket, more);
        let guid = rnic::softroce::ip_guid(ip);
        let client = nicd::Direct::new(nicd::NicdProvider::connect(&socket).unwrap());
        let ca = client
            .open_ca(guid, 1, Arc::new(verbs::IgnoreEvents))
            .unwrap();
        let pd = client.alloc_pd(ca, 2).unwrap();
        let cq = client.create_cq(pd, &verbs::CqInit { cqe: 4 }, 3).unwrap();
        let init = verbs::QpInit {
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            caps: verbs::QpCaps::default(),
            sq_sig_all: false,
            port: None,
        };
        let qp = client.create_qp(pd, &init, 4).unwrap();
        let qpn = client.qp_num(qp).unwrap().value();
        let text = clients_listed(&socket);
        let line = format!(
            "its own QPs on NIC {:#018x}: block 1 of the shared port",
            guid.0
        );
        if shared {
            assert_eq!(roce_udp::qpn_block(qpn), 1);
            assert!(client.nic().is_some());
            assert_eq!(text.matches(&line).count(), 1, "{text}");
        } else {
            // Not lent: the QP is the daemon's, no node here.
            assert!(client.nic().is_none());
            assert!(!text.contains("its own QPs"), "{text}");
        }
        // SAFETY: a signal to our own child, not yet waited for.
        unsafe { libc::kill(nicd.id() as i32, libc::SIGTERM) };
        assert!(nicd.wait().unwrap().success());
        std::mem::forget(reap);
    }
}
