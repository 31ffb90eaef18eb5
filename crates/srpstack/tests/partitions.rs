//! Partitions on the SRP data path, with `ibsm run` and a partitions
//! file, srptd and srpd processes on a managed subnet.
//!
//! `the_login_partition_isolates_the_data_path` (127.0.145.x): the
//! target (.2, limited) and initiator A (.3, full) are in partition
//! 0x0010; initiator B (.4) is only in the default partition. srptd
//! serves 0x0010 alone (`pkey = 0x0010`).
//! - A's login with `pkey=8010` works and data written through the LUN
//!   file reads back: A's QP uses the 0x8010 entry of its table, the REQ
//!   carries that key, and the target's QP takes its 0x0010 entry;
//! - A's login with `pkey=ffff` (the default partition, both ports full
//!   members) reaches the target by CM in P_Key ffff, which srptd does
//!   not serve: refused, srptd's log naming the key, and nothing reaches
//!   the data path (no P_Key violation at the target's NIC);
//! - B's login with `pkey=8010` fails at once, naming the P_Key its port
//!   lacks.
//!
//! `one_target_serves_two_partitions` (127.0.151.x): srptd serves
//! 0x0010 (full member) and 0x0020 (limited member); A is in 0x0010, B in
//! 0x0020, both full. Each login's session is in its own partition
//! (`srptadm sessions` shows the P_Key of each session's QP) and moves
//! data; A's login in 0x0030, which the target's port holds but srptd
//! does not serve, is refused naming P_Key 8030.
//!
//! `a_port_of_another_partition_reaches_the_target_by_no_path`
//! (127.0.163.x): partitions hold on every path, not only the SA's. The
//! target (.2) is a full member of 0x0010 and a limited one of the
//! default partition; A (.3) a full member of both; B (.4) and .5 of
//! 0x0020 only (and, as every port, limited members of the default
//! partition). A and B are ports of this process on the managed subnet.
//! A's device management walk at the target (no SA) finds the SRP I/O
//! controller. B's DM query, its DM walk (`rdma_access::dm::query_iocs`,
//! what `srp discover --target` runs, and the command itself from .5 with
//! `--fabric ib`) and its direct IB CM login (the target's GID and service
//! ID, no SA) get no answer: the target's port drops every MAD of theirs
//! (they carry the limited default key 0x7fff their ports hold, no longer
//! 0xffff), counts them (`nic_pkey_violations`), and its SMA reports them
//! by trap 257, which `ibsm` logs naming B's port.
//!
//! The tests with srpd are skipped when the machine lacks FUSE, a failure
//! under `CI=true` (`rdma_testkit::need`).

mod common;

use common::{gid_hex, ibsm_bin, run, tool, Proc};
use srp::initiator::ChannelConfig;
use srp_initiator::session::{Session, SessionConfig};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

/// A managed subnet on 127.0.`net`.x: `ibsm run` on .1, srptd on .2,
/// srpd on .3, .4, ... Dropped in that order backwards.
struct Subnet {
    net: u8,
    dir: PathBuf,
    /// srpd processes with their mount roots and control sockets.
    initiators: Vec<(Proc, PathBuf, PathBuf)>,
    target: Proc,
    /// srptd's control socket.
    tsock: PathBuf,
    sm: Proc,
}

impl Subnet {
    fn ip(net: u8, last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, 0, net, last))
    }

    /// The port GUID of host `last` (the SM keys partitions by it).
    fn guid(net: u8, last: u8) -> u64 {
        rnic::softroce::ip_guid(Self::ip(net, last)).0
    }

    /// Starts the SM with the partitions file `partitions`, srptd with
    /// `target.pkey = <pkey>` and `initiators` srpd processes; the SM also
    /// manages the hosts `others` (ports the test runs itself).
    fn start(net: u8, partitions: &str, pkey: &str, initiators: u8, others: &[u8]) -> Subnet {
        let ip = |last| Self::ip(net, last);
        let dir = std::env::temp_dir().join(format!("srp-partitions-{net}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let parts = dir.join("partitions.conf");
        std::fs::write(&parts, partitions).unwrap();
        let tsock = dir.join("t.sock");
        let conf = dir.join("srptd.toml");
        std::fs::write(
            &conf,
            format!(
                "[target]\nip = \"{}\"\nfabric = \"ib\"\nsm_wait_ms = 10000\npkey = {pkey}\n\
                 control_socket = \"{}\"\n\n[[device]]\nname = \"disk0\"\nhandler = \"ram\"\n\
                 size = \"8M\"\n\n[[lun]]\nlun = 0\ndevice = \"disk0\"\n",
                ip(2),
                tsock.display()
            ),
        )
        .unwrap();
        let mut sm = tool(ibsm_bin());
        sm.args(["run", "--addr", &ip(1).to_string()]);
        for n in (2..3 + initiators).chain(others.iter().copied()) {
            sm.args(["--node", &ip(n).to_string()]);
        }
        sm.args(["--sweep-interval-ms", "200", "--timeout-ms", "100"])
            .args(["--retries", "1", "--partitions"])
            .arg(&parts);
        let sm = Proc::start("ibsm", &mut sm);
        sm.wait_line("ibsm: SM and SA at", 20);
        let target = Proc::start(
            "srptd",
            common::tool(common::srptd_bin()).arg("--config").arg(&conf),
        );
        target.wait_line("ACTIVE on the managed subnet", 20);
        target.wait_line("listening on", 20);
        let initiators = (3..3 + initiators)
            .map(|n| {
                let (root, sock) = (dir.join(format!("i{n}")), dir.join(format!("i{n}.sock")));
                std::fs::create_dir_all(&root).unwrap();
                let p = Proc::start(
                    "srpd",
                    common::tool(common::srpd_bin())
                        .args(["--fabric", "ib", "--sm-wait-ms", "10000"])
                        .args(["--ip", &ip(n).to_string()])
                        .arg("--mount-root")
                        .arg(&root)
                        .arg("--control-socket")
                        .arg(&sock),
                );
                p.wait_line("srpd: ready on", 20);
                (p, root, sock)
            })
            .collect();
        Subnet {
            net,
            dir,
            initiators,
            target,
            tsock,
            sm,
        }
    }

    /// The login string of the target in partition `pkey` (hex digits).
    fn login_string(&self, pkey: &str) -> String {
        let t = Self::guid(self.net, 2);
        format!(
            "id_ext={t:016x},ioc_guid={t:016x},dgid={},pkey={pkey},service_id={t:016x}",
            gid_hex(Self::ip(self.net, 2))
        )
    }

    /// Initiator `last` (3, 4, ...) logs in as `name` in `pkey`.
    fn login(&self, last: u8, pkey: &str, name: &str) -> (bool, String) {
        let sock = &self.initiators[usize::from(last - 3)].2;
        run(common::tool(common::srp_bin())
            .args(["login", &self.login_string(pkey), "--name", name])
            .arg("--control-socket")
            .arg(sock))
    }

    /// The LUN 0 file of login `name` of initiator `last`.
    fn lun0(&self, last: u8, name: &str) -> PathBuf {
        self.initiators[usize::from(last - 3)]
            .1
            .join(name)
            .join("lun0")
    }

    /// `srptadm --json <what>` of the target.
    fn admin(&self, what: &str) -> serde_json::Value {
        let (ok, out) = run(Command::new(common::srptadm_bin())
            .arg("--socket")
            .arg(&self.tsock)
            .args(["--json", what]));
        assert!(ok, "{out}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
    }

    fn pkey_violations(&self) -> u64 {
        let v = self.admin("show");
        v["nic_pkey_violations"]
            .as_u64()
            .unwrap_or_else(|| panic!("no nic_pkey_violations in {v}"))
    }
}

impl Drop for Subnet {
    fn drop(&mut self) {
        self.initiators.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn no_fuse() -> bool {
    !rdma_testkit::need::fuse()
}

#[test]
fn the_login_partition_isolates_the_data_path() {
    if no_fuse() {
        return;
    }
    let started = Instant::now();
    let g = |last| Subnet::guid(145, last);
    let net = Subnet::start(
        145,
        &format!(
            "Default=0x7fff : ALL=full ;\nstorage=0x0010 : {:#x}=full, {:#x} ;\n",
            g(3),
            g(2)
        ),
        "0x0010",
        2,
        &[],
    );

    // A in partition 0x0010: login, then data through the LUN file.
    let (ok, out) = net.login(3, "8010", "part");
    assert!(ok, "{out}");
    let line = net.target.wait_line("accepted", 10);
    assert!(line.contains("in P_Key 8010"), "{line}");
    common::write_read_back(&net.lun0(3, "part"), 13);
    // Nothing of A's was dropped for its P_Key: A's QP sends with the
    // 0x0010 partition's key (0xffff would not pass the target's QP).
    let t_show = net.admin("show");
    assert_eq!(t_show["pkey"], serde_json::json!(0x0010), "{t_show}");
    assert_eq!(
        t_show["nic_pkey_violations"],
        serde_json::json!(0),
        "{t_show}"
    );
    let sessions = net.admin("sessions");
    assert_eq!(sessions[0]["pkey"], serde_json::json!(0x0010), "{sessions}");

    // A in the default partition: the REQ says so, and srptd, serving
    // 0x0010 alone, refuses it before any QP of the partition exists.
    let t0 = Instant::now();
    let (ok, out) = net.login(3, "ffff", "dflt");
    assert!(!ok, "a login outside the target's partition worked: {out}");
    let line = net.target.wait_line("rejected", 10);
    assert!(
        line.contains("P_Key ffff") && line.contains("does not serve"),
        "{line}"
    );
    assert_eq!(
        net.pkey_violations(),
        0,
        "the refused login reached the data path"
    );
    eprintln!(
        "default-partition login refused after {} ms: {}",
        t0.elapsed().as_millis(),
        line.trim()
    );

    // B is not in 0x0010 at all: refused before anything is sent.
    let (ok, out) = net.login(4, "8010", "part");
    assert!(!ok, "{out}");
    assert!(
        out.contains("P_Key 8010") && out.contains("not a member"),
        "{out}"
    );

    drop(net);
    eprintln!("partitions test: {} ms", started.elapsed().as_millis());
}

#[test]
fn one_target_serves_two_partitions() {
    if no_fuse() {
        return;
    }
    let started = Instant::now();
    let g = |last| Subnet::guid(151, last);
    let (t, a, b) = (g(2), g(3), g(4));
    // The target is a full member of 0x0010 and 0x0030 and a limited one
    // of 0x0020; A is in 0x0010 and 0x0030, B in 0x0020.
    let net = Subnet::start(
        151,
        &format!(
            "Default=0x7fff : ALL=full ;\nblue=0x0010 : {t:#x}=full, {a:#x}=full ;\n\
             green=0x0020 : {t:#x}, {b:#x}=full ;\ngrey=0x0030 : {t:#x}=full, {a:#x}=full ;\n"
        ),
        "[0x0010, 0x0020]",
        2,
        &[],
    );

    let (ok, out) = net.login(3, "8010", "blue");
    assert!(ok, "{out}");
    let (ok, out) = net.login(4, "8020", "green");
    assert!(ok, "{out}");
    common::write_read_back(&net.lun0(3, "blue"), 17);
    common::write_read_back(&net.lun0(4, "green"), 19);

    // Each session's QP is in its initiator's partition: A's at the
    // target's full 0x8010 entry, B's at its limited 0x0020 one (B is
    // the full member there).
    let sessions = net.admin("sessions");
    let pkey_of = |guid: u64| {
        let s: Vec<&serde_json::Value> = sessions
            .as_array()
            .expect("a list")
            .iter()
            .filter(|s| {
                s["initiator"]
                    .as_str()
                    .is_some_and(|n| n.ends_with(&format!("{guid:016x}")))
            })
            .collect();
        assert_eq!(s.len(), 1, "one session of {guid:#x}: {sessions}");
        s[0]["pkey"].clone()
    };
    assert_eq!(pkey_of(a), serde_json::json!(0x8010), "{sessions}");
    assert_eq!(pkey_of(b), serde_json::json!(0x0020), "{sessions}");
    assert_eq!(net.pkey_violations(), 0);

    // 0x0030: the SA has a path (both ports are members) and the target's
    // port holds the key, but srptd does not serve it.
    let (ok, out) = net.login(3, "8030", "grey");
    assert!(
        !ok,
        "a login in a partition the target does not serve: {out}"
    );
    let line = net.target.wait_line("rejected", 10);
    assert!(
        line.contains("P_Key 8030") && line.contains("does not serve"),
        "{line}"
    );
    assert_eq!(net.admin("sessions").as_array().map(Vec::len), Some(2));

    drop(net);
    eprintln!("two-partition test: {} ms", started.elapsed().as_millis());
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
        let conn = Arc::new(srpstack::Direct {
            pkey: Some(Pkey(k)),
            ..srpstack::Direct::new(port.clone(), rdma_types::Lid(1))
        });
        let mut cfg = SessionConfig::new(chan.clone());
        cfg.pkey = Some(Pkey(k));
        let r = Session::connect(fabric.clone(), Guid(I), conn.clone(), cfg);
        let reason = conn.refused.lock().unwrap().clone();
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

#[test]
fn a_port_of_another_partition_reaches_the_target_by_no_path() {
    use rdma_access::dm::{get_request, query_iocs};
    use rdma_access::subnet::IbPort;
    use rdma_mad::dm::DmAttr;
    use rdma_types::{Gid, Guid};
    use rnic::softroce::ip_guid as ib_guid;
    use std::time::Duration;
    const NET: u8 = 163;
    let started = Instant::now();
    let ip = |last| Subnet::ip(NET, last);
    let g = |last| Subnet::guid(NET, last);
    let net = Subnet::start(
        NET,
        &format!(
            "Default=0x7fff : {a:#x}=full ;\nstorage=0x0010 : {t:#x}=full, {a:#x}=full ;\n\
             other=0x0020 : {b:#x}=full, {c:#x}=full ;\n",
            t = g(2),
            a = g(3),
            b = g(4),
            c = g(5),
        ),
        "0x0010",
        0,
        &[3, 4, 5],
    );
    // A and B: ports of this process, ACTIVE on the subnet.
    let p = rnic::softroce::SoftRoce::new(rnic::softroce::SoftCa::at_each(&[ip(3), ip(4)]), 4791);
    let port = |last: u8| {
        p.set_personality(ib_guid(ip(last)), rnic::softroce::Personality::Ib)
            .unwrap();
        let port = IbPort::start(
            p.clone(),
            ib_guid(ip(last)),
            ip(last),
            &format!("initiator {last}"),
            false,
            u32::from(last) << 16,
        )
        .unwrap();
        port.wait_active(Duration::from_secs(20)).unwrap();
        port
    };
    let (a, b) = (port(3), port(4));
    assert_eq!(
        (a.pkeys()[0].0, b.pkeys()[0].0),
        (0xffff, 0x7fff),
        "A a full, B a limited member of the default partition"
    );
    let target = Gid::from_ip(ip(2));
    let wait = Duration::from_millis(200);

    // A, in the default partition with the target: the walk finds it.
    let iocs = query_iocs(a.agent(), target, wait, 3).expect("A's walk answered");
    assert_eq!(iocs.len(), 1, "{iocs:?}");
    assert_eq!(iocs[0].1.profile.guid, Guid(g(2)));
    assert_eq!(net.pkey_violations(), 0);

    // B: a DM Get at the target's QP1 gets no answer, and the SM hears.
    let dm = b
        .agent()
        .mad_agent(u8::from(rdma_mad::mad::MgmtClass::DevMgt), 1, &[])
        .unwrap();
    let r = dm.request(target, get_request(DmAttr::ClassPortInfo, 0), wait, 1);
    assert!(
        r.is_err(),
        "the target answered a port of another partition"
    );
    let line = net.sm.wait_line("trap 257", 10);
    assert!(
        line.contains(&format!("{:#018x}", g(2)))
            && line.contains(&format!("(port {:#018x})", g(4)))
            && line.contains("P_Key 7fff"),
        "{line}"
    );
    let after_get = net.pkey_violations();
    assert!(after_get > 0, "nothing counted");

    // B's DM walk (`srp discover --target` without the SA).
    let r = query_iocs(b.agent(), target, wait, 1);
    assert!(r.is_err(), "B's walk found {:?}", r.ok());
    let after_walk = net.pkey_violations();
    assert!(after_walk > after_get);

    // B's direct login: IB CM to the target's GID and service ID.
    let b_guid = ib_guid(ip(4));
    let chan = ChannelConfig::new(0x11, b_guid, g(2), Guid(g(2)));
    let conn = Arc::new(srp_initiator::connectors::IbCmConnector {
        agent: b.agent().clone(),
        dgid: target,
        service_id: g(2),
        timeout: Duration::from_secs(1),
    });
    let r = Session::connect(p.clone(), b_guid, conn, SessionConfig::new(chan));
    assert!(r.is_err(), "B logged in across partitions");
    assert!(
        net.pkey_violations() > after_walk,
        "the REQ was not counted"
    );

    // The command, from another port of B's partition.
    let (ok, out) = run(common::tool(common::srp_bin())
        .args(["discover", "--fabric", "ib", "--target", &ip(2).to_string()])
        .args(["--ip", &ip(5).to_string(), "--timeout-ms", "200"]));
    assert!(!ok && !out.contains("id_ext="), "{out}");
    assert!(out.contains("device management query failed"), "{out}");

    drop((a, b));
    drop(net);
    eprintln!(
        "partition enforcement test: {} ms",
        started.elapsed().as_millis()
    );
}
