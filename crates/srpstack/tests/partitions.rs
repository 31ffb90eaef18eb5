//! Partitions on the SRP data path, on 127.0.145.x: `ibsm run` with a
//! partitions file puts the target (.2, limited) and initiator A (.3,
//! full) in partition 0x0010; initiator B (.4) is only in the default
//! partition. srptd serves 0x0010 alone (`pkey = 0x0010`), so its QPs use
//! the index of its P_Key table holding 0x0010.
//!
//! - A's login with `pkey=8010` works and data written through the LUN
//!   file reads back: A's QP uses the 0x8010 entry of its table (the
//!   target's QP drops anything else) and the target's QP the 0x0010 one;
//! - A's login with `pkey=ffff` (the default partition, both ports full
//!   members) reaches the target by CM, but its SRP traffic is dropped by
//!   the target's QP for its P_Key, so the login fails: the partition
//!   isolates;
//! - B's login with `pkey=8010` fails at once, naming the P_Key its port
//!   lacks.
//!
//! Prints "SKIPPED: ..." and passes when the machine lacks FUSE.

mod common;

use common::{gid_hex as gid_of, ibsm_bin, run, Proc};
use srp::initiator::ChannelConfig;
use srp_initiator::session::{
    ConnectError, Connected, Connector, LoginForm, QpInfo, Session, SessionConfig,
};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

fn gid_hex(last: u8) -> String {
    gid_of(ip(last))
}

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 145, last))
}

fn srpd(last: u8, root: &Path, sock: &Path) -> Proc {
    let p = Proc::start(
        "srpd",
        Command::new(env!("CARGO_BIN_EXE_srpd"))
            .args(["--fabric", "ib", "--sm-wait-ms", "10000"])
            .args(["--ip", &ip(last).to_string()])
            .arg("--mount-root")
            .arg(root)
            .arg("--control-socket")
            .arg(sock),
    );
    p.wait_line("srpd: ready on", 20);
    p
}

/// `srptadm show` of the target, as JSON.
fn show(sock: &Path) -> serde_json::Value {
    let (ok, out) = run(Command::new(env!("CARGO_BIN_EXE_srptadm"))
        .arg("--socket")
        .arg(sock)
        .args(["--json", "show"]));
    assert!(ok, "{out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn pkey_violations(sock: &Path) -> u64 {
    let v = show(sock);
    v["nic_pkey_violations"]
        .as_u64()
        .unwrap_or_else(|| panic!("no nic_pkey_violations in {v}"))
}

fn login(sock: &Path, target: &str, name: &str) -> (bool, String) {
    run(Command::new(env!("CARGO_BIN_EXE_srp"))
        .args(["login", target, "--name", name, "--control-socket"])
        .arg(sock))
}

#[test]
fn the_login_partition_isolates_the_data_path() {
    if !Path::new("/dev/fuse").exists() {
        println!("SKIPPED: no /dev/fuse (apt-get install fuse3)");
        return;
    }
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!("srp-partitions-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (root_a, root_b) = (dir.join("a"), dir.join("b"));
    std::fs::create_dir_all(&root_a).unwrap();
    std::fs::create_dir_all(&root_b).unwrap();
    let g = |last| srpstack::ib::ib_guid(ip(last)).0;
    let parts = dir.join("partitions.conf");
    std::fs::write(
        &parts,
        format!(
            "Default=0x7fff : ALL=full ;\nstorage=0x0010 : {:#x}=full, {:#x} ;\n",
            g(3),
            g(2)
        ),
    )
    .unwrap();
    let tsock = dir.join("t.sock");
    let conf = dir.join("srptd.toml");
    std::fs::write(
        &conf,
        format!(
            "[target]\nip = \"{}\"\nfabric = \"ib\"\nsm_wait_ms = 10000\npkey = 0x0010\n\
             control_socket = \"{}\"\n\n[[device]]\nname = \"disk0\"\nhandler = \"ram\"\n\
             size = \"8M\"\n\n[[lun]]\nlun = 0\ndevice = \"disk0\"\n",
            ip(2),
            tsock.display()
        ),
    )
    .unwrap();

    let mut sm = Command::new(ibsm_bin());
    sm.args(["run", "--addr", &ip(1).to_string()]);
    for n in [2, 3, 4] {
        sm.args(["--node", &ip(n).to_string()]);
    }
    sm.args(["--sweep-interval-ms", "200", "--timeout-ms", "100"])
        .args(["--retries", "1", "--partitions"])
        .arg(&parts);
    let sm = Proc::start("ibsm", &mut sm);
    sm.wait_line("ibsm: SM and SA at", 20);
    let target = Proc::start(
        "srptd",
        Command::new(env!("CARGO_BIN_EXE_srptd"))
            .arg("--config")
            .arg(&conf),
    );
    target.wait_line("ACTIVE on the managed subnet", 20);
    target.wait_line("listening on", 20);
    let (sock_a, sock_b) = (dir.join("a.sock"), dir.join("b.sock"));
    let a = srpd(3, &root_a, &sock_a);
    let b = srpd(4, &root_b, &sock_b);

    let t = g(2);
    let string = |pkey: &str| {
        format!(
            "id_ext={t:016x},ioc_guid={t:016x},dgid={},pkey={pkey},service_id={t:016x}",
            gid_hex(2)
        )
    };

    // A in partition 0x0010: login, then data through the LUN file.
    let (ok, out) = login(&sock_a, &string("8010"), "part");
    assert!(ok, "{out}");
    let file = root_a.join("part").join("lun0");
    common::write_read_back(&file, 13);
    // Nothing of A's was dropped for its P_Key: A's QP sends with the
    // 0x0010 partition's key (0xffff would not pass the target's QP).
    let t_show = show(&tsock);
    assert_eq!(t_show["pkey"], serde_json::json!(0x0010), "{t_show}");
    assert_eq!(
        t_show["nic_pkey_violations"],
        serde_json::json!(0),
        "{t_show}"
    );

    // A in the default partition: the CM exchange (QP1) goes through, but
    // the target's QP is in 0x0010 and drops A's 0xffff packets.
    let t0 = Instant::now();
    let (ok, out) = login(&sock_a, &string("ffff"), "dflt");
    assert!(!ok, "a login outside the target's partition worked: {out}");
    // The target's NIC dropped A's packets for their P_Key.
    let dropped = pkey_violations(&tsock);
    assert!(dropped > 0, "no P_Key violation counted");
    eprintln!(
        "default-partition login failed after {} ms ({dropped} packets dropped for their P_Key): {}",
        t0.elapsed().as_millis(),
        out.trim()
    );

    // B is not in 0x0010 at all: refused before anything is sent.
    let (ok, out) = login(&sock_b, &string("8010"), "part");
    assert!(!ok, "{out}");
    assert!(
        out.contains("P_Key 8010") && out.contains("not a member"),
        "{out}"
    );

    drop((a, b, target, sm));
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("partitions test: {} ms", started.elapsed().as_millis());
}

/// Connects by calling the target port's login entry point directly with
/// the partition key a CM REQ would carry; keeps the target's reason.
struct InPartition {
    port: Arc<srp_target::TargetPort>,
    pkey: rdma_types::Pkey,
    reason: std::sync::Mutex<String>,
}

impl Connector for InPartition {
    fn connect(&self, login: &[u8], local: QpInfo) -> Result<Connected, ConnectError> {
        let peer = srp_target::PeerQp {
            qpn: local.qpn,
            psn: local.psn,
            gid: local.gid,
            lid: local.lid,
            mtu: local.mtu,
        };
        match self
            .port
            .login_in_partition(login, srp::target::LoginForm::RdmaCm, peer, self.pkey)
        {
            srp_target::LoginOutcome::Accepted {
                conn,
                local: t,
                rsp,
            } => Ok(Connected {
                peer: QpInfo {
                    qpn: t.qpn,
                    psn: t.psn,
                    gid: self.port.gid(),
                    lid: rdma_types::Lid(1),
                    mtu: local.mtu,
                },
                private_data: rsp,
                handle: conn.0,
            }),
            srp_target::LoginOutcome::Rejected { rej, reason } => {
                *self.reason.lock().unwrap() = reason;
                Err(ConnectError::Rejected(rej))
            }
        }
    }
    fn disconnect(&self, handle: u64) {
        self.port.disconnected(srp_target::ConnId(handle));
    }
    fn form(&self) -> LoginForm {
        LoginForm::RdmaCm
    }
}

/// In process, on the loopback provider: the initiator's table index
/// follows the login's partition, and the target port refuses a REQ in a
/// partition it does not serve or its table lacks, naming the P_Key.
#[test]
fn partition_choice_and_refusals_in_process() {
    use rdma_types::{Guid, Pkey, PortNum};
    use rnic::loopback::{CaConfig, Fabric};
    const T: u64 = 0x0002_c903_0000_7101;
    const I: u64 = 0x0002_c903_0000_7102;
    let fabric = Fabric::new();
    fabric.add_ca(CaConfig::simple(T, 1)).unwrap();
    fabric.add_ca(CaConfig::simple(I, 2)).unwrap();
    let full = |k: u16| Pkey(k | 0x8000);
    fabric
        .set_pkeys(
            Guid(T),
            PortNum(1),
            vec![Pkey(0xffff), Pkey(0x0010), full(0x30)],
        )
        .unwrap();
    fabric
        .set_pkeys(
            Guid(I),
            PortNum(1),
            vec![Pkey(0xffff), full(0x10), full(0x20), full(0x30), full(0x40)],
        )
        .unwrap();
    let start = |served: Vec<Pkey>| {
        let chan = ChannelConfig::new(0x11, Guid(I), T, Guid(T));
        let scsi = Arc::new(scsi::Target::new());
        let dev = scsi::Device::new(
            scsi::DeviceConfig::default(),
            Arc::new(scsi::Ram::new(1 << 20)),
        )
        .unwrap();
        scsi.add_lun(None, scsi::Lun::new(0).unwrap(), Arc::new(dev));
        let opts = srp_target::PortOptions {
            pkeys: served,
            ..Default::default()
        };
        let port = srp_target::TargetPort::start(
            fabric.clone(),
            Guid(T),
            srp::target::TargetConfig::new(chan.target_port_id(), "parts"),
            scsi,
            opts,
        )
        .unwrap();
        (Arc::new(port), chan)
    };
    let login = |port: &Arc<srp_target::TargetPort>, chan: &ChannelConfig, k: u16| {
        let conn = Arc::new(InPartition {
            port: port.clone(),
            pkey: Pkey(k),
            reason: Default::default(),
        });
        let mut cfg = SessionConfig::new(chan.clone());
        cfg.pkey = Some(Pkey(k));
        let r = Session::connect(fabric.clone(), Guid(I), conn.clone(), cfg);
        let reason = conn.reason.lock().unwrap().clone();
        (r, reason)
    };

    // The target serves 0x0010 and 0x0030.
    let (port, chan) = start(vec![Pkey(0x0010), full(0x30)]);
    let (r, _) = login(&port, &chan, 0x8010);
    let sess = r.expect("a login in a served partition");
    assert_eq!(port.sessions().len(), 1);
    drop(sess);
    // The initiator's port lacks 0x0050: refused before any REQ.
    let (r, reason) = login(&port, &chan, 0x8050);
    let e = r.err().expect("no such P_Key").to_string();
    assert!(
        e.contains("P_Key 8050") && e.contains("not a member"),
        "{e}"
    );
    assert!(reason.is_empty(), "the target was asked: {reason}");
    // 0x0020: the initiator has it, the target does not serve it.
    let (r, reason) = login(&port, &chan, 0x8020);
    assert!(r.is_err());
    assert!(
        reason.contains("P_Key 8020") && reason.contains("does not serve"),
        "{reason}"
    );

    // Serving all of its table: 0x0040 is not in it.
    let (port, chan) = start(Vec::new());
    let (r, _) = login(&port, &chan, 0x8030);
    r.expect("a login in a partition of the target's table");
    let (r, reason) = login(&port, &chan, 0x8040);
    assert!(r.is_err());
    assert!(
        reason.contains("P_Key 8040") && reason.contains("not a member"),
        "{reason}"
    );
}
