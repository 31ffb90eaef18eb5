//! ALUA end to end (issue 30 item 1): one `srptd` with two `[[target]]`
//! ports (127.93.1.1 and .3) in two target port groups, `a` active and
//! `b` standby, and `srp io` over both paths with the round-robin policy,
//! which without ALUA would spread I/O over both. The verified workload
//! must go to `a` only; `srptadm set-group-state` then fails over to `b`,
//! `srptadm reload` of the unchanged file back to `a`, and each time the
//! I/O moves (the sessions' command
//! counts on the target say where it goes), with no error and every block
//! read back as last written.

mod common;

use common::{srptadm, srptadm_json, Proc};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

/// Commands each group's port has accepted, all sessions together:
/// (group a, group b).
fn commands(sock: &Path, names: &(String, String)) -> (u64, u64) {
    let sessions = srptadm_json(sock, &["sessions"]);
    let of = |name: &str| {
        sessions
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["target"] == name)
            .filter_map(|s| s["commands"].as_u64())
            .sum()
    };
    (of(&names.0), of(&names.1))
}

/// Waits (bounded) until the port of `which` (0: a, 1: b) has accepted
/// `more` commands beyond `from`; returns the counts then.
fn wait_for_commands(
    sock: &Path,
    names: &(String, String),
    which: usize,
    from: (u64, u64),
    more: u64,
) -> (u64, u64) {
    let end = Instant::now() + Duration::from_secs(90);
    loop {
        let now = commands(sock, names);
        let (got, base) = if which == 0 {
            (now.0, from.0)
        } else {
            (now.1, from.1)
        };
        if got >= base + more {
            return now;
        }
        assert!(
            Instant::now() < end,
            "port {} never got {more} more commands: {now:?} from {from:?}",
            ["a", "b"][which]
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn srp_io_follows_target_port_groups_through_failover_and_back() {
    let dir = std::env::temp_dir().join(format!("srp-alua-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("srptd.sock");
    let cfg = dir.join("srptd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[target]]\nip = \"127.93.1.1\"\nrel_tgt_id = 1\ncontrol_socket = \"{}\"\n\n\
             [[target]]\nip = \"127.93.1.3\"\nrel_tgt_id = 2\n\n\
             [alua]\nimplicit_transition_time = 5\n\n\
             [[target_group]]\nname = \"a\"\ngroup_id = 1\nstate = \"active\"\npreferred = true\ntargets = [1]\n\n\
             [[target_group]]\nname = \"b\"\ngroup_id = 2\nstate = \"standby\"\ntargets = [2]\n\n\
             [[device]]\nname = \"disk0\"\nhandler = \"ram\"\nsize = \"32M\"\nusn = \"alua-e2e\"\n\n\
             [[lun]]\nlun = 0\ndevice = \"disk0\"\n",
            sock.display()
        ),
    )
    .unwrap();
    // `--check` accepts the file; a misspelt state is refused naming it.
    let (ok, out) = common::run(
        common::tool(common::srptd_bin())
            .args(["--check", "--config"])
            .arg(&cfg),
    );
    assert!(ok, "{out}");
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("\"standby\"", "\"stand-by\""),
    )
    .unwrap();
    let (ok, out) = common::run(
        common::tool(common::srptd_bin())
            .args(["--check", "--config"])
            .arg(&bad),
    );
    assert!(!ok, "{out}");
    assert!(
        out.contains(
            "bad.toml:23: target_group[1].state: unknown asymmetric access state `stand-by`"
        ),
        "{out}"
    );

    let _d = common::start_srptd(&cfg);
    let groups = srptadm_json(&sock, &["target-groups"]);
    let port_of = |i: usize| {
        groups["groups"][i]["ports"][0]["target"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let names = (port_of(0), port_of(1));
    assert_eq!(groups["groups"][1]["state"], "standby", "{groups}");
    let (ok, text) = srptadm(&sock, &["target-groups"]);
    assert!(
        ok && text.contains("standby") && !text.contains("(remote)"),
        "{text}"
    );

    let io = Proc::start(
        "srp io",
        common::tool(common::srp_bin()).args([
            "io",
            "--dest",
            "127.93.1.1:5555",
            "--ip",
            "127.93.1.2",
            "--dest",
            "127.93.1.3:5555",
            "--ip",
            "127.93.1.4",
            "--path-policy",
            "round-robin",
            "--region",
            "4M",
            "--size",
            "160M",
        ]),
    );
    let first = io.wait_line("srp: logged in", 30);
    assert!(first.contains("(2 paths"), "{first}");

    // Round robin, but only a serves: b's port sees the opening commands
    // (TEST UNIT READY, INQUIRY, READ CAPACITY, VPD pages) and no I/O.
    let start = commands(&sock, &names);
    let at_a = wait_for_commands(&sock, &names, 0, start, 500);
    assert!(at_a.1 < 20, "I/O went to the standby port: {at_a:?}");

    // Fail over: b active first, then a standby (as a cluster manager
    // would promote, then demote).
    let (ok, out) = srptadm(&sock, &["set-group-state", "b", "active"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("target port group b (2): standby -> active; every session gets ASYMMETRIC ACCESS STATE CHANGED"),
        "{out}"
    );
    let (ok, out) = srptadm(&sock, &["set-group-state", "1", "standby"]);
    assert!(ok, "{out}");
    let moved = commands(&sock, &names);
    let at_b = wait_for_commands(&sock, &names, 1, moved, 500);
    assert!(
        at_b.0 - moved.0 < 60,
        "I/O still went to a after it went standby: {moved:?} -> {at_b:?}"
    );

    // And back, by a reload: the file still says a active, b standby.
    let (ok, out) = srptadm(&sock, &["reload"]);
    assert!(ok, "{out}");
    assert!(
        out.contains(
            "target port groups changed (every session gets ASYMMETRIC ACCESS STATE CHANGED)"
        ),
        "{out}"
    );
    let back = commands(&sock, &names);
    let again = wait_for_commands(&sock, &names, 0, back, 500);
    assert!(
        again.1 - back.1 < 60,
        "I/O still went to b after it went standby: {back:?} -> {again:?}"
    );
    let groups = srptadm_json(&sock, &["target-groups"]);
    assert_eq!(
        (
            groups["groups"][0]["state"].as_str(),
            groups["groups"][1]["state"].as_str()
        ),
        (Some("active"), Some("standby"))
    );

    // The whole run: no error, every block read back as last written.
    let rest = io.rest(240).join("\n");
    println!("{first}\n{rest}");
    let verified = common::report::verified_clean(&rest);
    assert!(verified >= 4 << 20, "{rest}");
    let mut io = io;
    assert!(io.child.wait().unwrap().success(), "{rest}");

    // An unknown group is refused with the groups there are.
    let (ok, out) = srptadm(&sock, &["set-group-state", "c", "active"]);
    assert!(!ok);
    assert!(
        out.contains(
            "no target port group `c` (give its name or group_id; the groups are a (1), b (2))"
        ),
        "{out}"
    );
    let (ok, out) = srptadm(&sock, &["set-group-state", "a", "optimal"]);
    assert!(
        !ok && out.contains("unknown asymmetric access state `optimal`"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// An initiator's SET TARGET PORT GROUPS (explicit ALUA) changes the
/// states in force, and `srptadm write-config` saves those, not the ones
/// the file was started with: a restart from the saved file keeps the
/// initiator's choice.
#[test]
fn a_state_set_by_an_initiator_is_what_write_config_saves() {
    use rdma_access::CmAgent;
    use rdma_types::Guid;
    use rnic::softroce::{SoftCa, SoftRoce, ROCE_PORT};
    use srp::initiator::ChannelConfig;
    use srp_initiator::session::{Session, SessionConfig, Xfer};
    use std::sync::Arc;

    let dir = std::env::temp_dir().join(format!("srp-alua-stpg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("srptd.sock");
    let cfg = dir.join("srptd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[target]]\nip = \"127.93.2.1\"\nrel_tgt_id = 1\ncontrol_socket = \"{}\"\n\n\
             [[target]]\nip = \"127.93.2.3\"\nrel_tgt_id = 2\n\n\
             [alua]\nexplicit = true\n\n\
             [[target_group]]\nname = \"a\"\ngroup_id = 1\nstate = \"active\"\ntargets = [1]\n\n\
             [[target_group]]\nname = \"b\"\ngroup_id = 2\nstate = \"standby\"\ntargets = [2]\n\n\
             [[device]]\nname = \"disk0\"\nhandler = \"ram\"\nsize = \"8M\"\n\n\
             [[lun]]\nlun = 0\ndevice = \"disk0\"\n",
            sock.display()
        ),
    )
    .unwrap();
    let _d = common::start_srptd(&cfg);

    // Our initiator, in this process, through group a's port.
    let guid = Guid(0x0002_c903_7f5d_0202);
    let p = SoftRoce::new(
        vec![SoftCa {
            guid,
            ip: "127.93.2.2".parse().unwrap(),
        }],
        ROCE_PORT,
    );
    let agent = CmAgent::start(p.clone(), guid, 0x9302).unwrap();
    let target = 0x0002_c903_7f5d_0201;
    let chan = ChannelConfig::new(1, guid, target, Guid(target));
    let mut scfg = SessionConfig::new(chan);
    scfg.pool_bytes = 1 << 20;
    let connector = Arc::new(srp_initiator::connectors::RdmaCmConnector {
        agent,
        src: "127.93.2.2".parse().unwrap(),
        dst: "127.93.2.1:5555".parse().unwrap(),
        timeout: Duration::from_secs(10),
    });
    let session = Session::connect(p, guid, connector, scfg).unwrap();

    // SET TARGET PORT GROUPS (SPC-4 6.36): b active/optimized, a standby.
    let mut params = vec![0u8; 4];
    params.extend_from_slice(&[0x00, 0, 0, 2]);
    params.extend_from_slice(&[0x02, 0, 0, 1]);
    let mut cdb = [0u8; 12];
    cdb[0] = 0xa4;
    cdb[1] = 0x0a;
    cdb[6..10].copy_from_slice(&(params.len() as u32).to_be_bytes());
    let lun0 = srp::wire::Lun::from_u64(0);
    // The login's first command gets the power-on unit attention.
    let tur = session.execute(lun0, &[0u8; 6], Xfer::None).unwrap();
    assert_eq!(tur.sense.get(2).map(|k| k & 0xf), Some(6), "{tur:?}");
    let r = session.execute(lun0, &cdb, Xfer::Out(&params)).unwrap();
    assert!(r.good(), "SET TARGET PORT GROUPS: {r:?}");
    let groups = srptadm_json(&sock, &["target-groups"]);
    let states = |g: &Value| {
        (
            g["groups"][0]["state"].as_str().map(str::to_string),
            g["groups"][1]["state"].as_str().map(str::to_string),
        )
    };
    let want = (Some("standby".to_string()), Some("active".to_string()));
    assert_eq!(states(&groups), want, "{groups}");

    // Saved as in force; the file's other lines stay.
    let (ok, out) = srptadm(&sock, &["write-config"]);
    assert!(ok, "{out}");
    let saved = srptd::config::Config::load(&cfg).unwrap();
    let of = |name: &str| {
        saved
            .target_groups
            .iter()
            .find(|g| g.name.get_ref() == name)
            .and_then(|g| g.state.as_ref().map(|s| s.get_ref().clone()))
    };
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert_eq!((of("a"), of("b")), want, "{text}");
    assert!(saved.alua().explicit, "{text}");
    session.close();
    let _ = std::fs::remove_dir_all(&dir);
}
