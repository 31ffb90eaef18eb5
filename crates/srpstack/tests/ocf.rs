//! The Pacemaker resource agent `crates/srptd/ocf/srptd` (issue 30 item
//! 3), against a real srptd on 127.93.2.x: its actions run as Pacemaker
//! runs them (OCF_RESKEY_* in the environment, the exit code is the
//! answer): start, monitor, promote (the group goes active), demote (it
//! goes standby), stop; a bad configuration is OCF_ERR_CONFIGURED. Then
//! Debian's `ocf-tester` (resource-agents) runs its own checks on it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

const OCF_SUCCESS: i32 = 0;
const OCF_ERR_CONFIGURED: i32 = 6;
const OCF_NOT_RUNNING: i32 = 7;
const OCF_RUNNING_MASTER: i32 = 8;

fn agent() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../srptd/ocf/srptd")
}

/// The directory holding our srptd and srptadm, first on PATH.
fn path_with_bins() -> std::ffi::OsString {
    let bins = common::srptd_bin().parent().unwrap().to_path_buf();
    let old = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::iter::once(bins).chain(std::env::split_paths(&old))).unwrap()
}

struct Setup {
    dir: PathBuf,
    cfg: PathBuf,
    sock: PathBuf,
}

impl Setup {
    /// `action` of the agent with this setup's parameters (and `more`);
    /// its exit code and output.
    fn run(&self, action: &str, more: &[(&str, &str)]) -> (i32, String) {
        let mut c = Command::new("sh");
        c.arg(agent())
            .arg(action)
            .env("PATH", path_with_bins())
            .env("OCF_RESOURCE_INSTANCE", "srptd-test")
            // srptd on a NIC of its own, at the test's address.
            .env("NICD_MODE", "own")
            .env("OCF_RESKEY_config", &self.cfg)
            .env("OCF_RESKEY_socket", &self.sock)
            .env("OCF_RESKEY_pidfile", self.dir.join("srptd.pid"))
            .env("OCF_RESKEY_logfile", self.dir.join("srptd.log"))
            .env("OCF_RESKEY_group", "local");
        for (k, v) in more {
            c.env(format!("OCF_RESKEY_{k}"), v);
        }
        let o = c.output().unwrap();
        (o.status.code().unwrap_or(-1), common::text(&o))
    }

    /// The state srptd reports for group `local`.
    fn state(&self) -> String {
        let (ok, out) = common::run(
            Command::new(common::srptadm_bin())
                .arg("--socket")
                .arg(&self.sock)
                .args(["--json", "target-groups"]),
        );
        assert!(ok, "{out}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        v["groups"][0]["state"].as_str().unwrap_or("").to_string()
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = self.run("stop", &[]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn setup(tag: &str, last: u8) -> Setup {
    let dir = std::env::temp_dir().join(format!("srp-ocf-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("srptd.sock");
    let cfg = dir.join("srptd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[target]]\nip = \"127.93.2.{last}\"\nrel_tgt_id = 1\ncontrol_socket = \"{}\"\n\n\
             [[target_group]]\nname = \"local\"\ngroup_id = 1\nstate = \"active\"\ntargets = [1, 2]\n\n\
             [[device]]\nname = \"disk0\"\nhandler = \"ram\"\nsize = \"8M\"\n\n\
             [[lun]]\nlun = 0\ndevice = \"disk0\"\n",
            sock.display()
        ),
    )
    .unwrap();
    Setup { dir, cfg, sock }
}

#[test]
fn agent_actions_against_a_real_srptd() {
    let s = setup("actions", 1);
    let (code, xml) = s.run("meta-data", &[]);
    assert_eq!(code, OCF_SUCCESS, "{xml}");
    for action in [
        "start",
        "stop",
        "monitor",
        "promote",
        "demote",
        "validate-all",
    ] {
        assert!(
            xml.contains(&format!("<action name=\"{action}\"")),
            "{action}: {xml}"
        );
    }
    assert_eq!(s.run("validate-all", &[]).0, OCF_SUCCESS);
    assert_eq!(s.run("monitor", &[]).0, OCF_NOT_RUNNING);
    let (code, out) = s.run("start", &[]);
    assert_eq!(code, OCF_SUCCESS, "{out}");
    // Started is unpromoted: the group went standby.
    assert_eq!(s.state(), "standby");
    assert_eq!(s.run("monitor", &[]).0, OCF_SUCCESS);
    assert_eq!(s.run("start", &[]).0, OCF_SUCCESS, "start twice");
    let (code, out) = s.run("promote", &[]);
    assert_eq!(code, OCF_SUCCESS, "{out}");
    assert_eq!(s.state(), "active");
    assert_eq!(s.run("monitor", &[]).0, OCF_RUNNING_MASTER);
    assert_eq!(s.run("promote", &[]).0, OCF_SUCCESS, "promote twice");
    assert_eq!(s.run("demote", &[]).0, OCF_SUCCESS);
    assert_eq!(s.state(), "standby");
    assert_eq!(s.run("monitor", &[]).0, OCF_SUCCESS);
    // A group srptd does not have is a configuration error.
    assert_eq!(
        s.run("monitor", &[("group", "elsewhere")]).0,
        OCF_ERR_CONFIGURED
    );
    assert_eq!(s.run("stop", &[]).0, OCF_SUCCESS);
    assert_eq!(s.run("monitor", &[]).0, OCF_NOT_RUNNING);
    assert_eq!(s.run("stop", &[]).0, OCF_SUCCESS, "stop twice");
    // A bad state word or file: not configured, and srptd not started.
    assert_eq!(
        s.run("validate-all", &[("promoted_state", "standby")]).0,
        OCF_ERR_CONFIGURED
    );
    std::fs::write(&s.cfg, "[[target_group]]\nname = 1\n").unwrap();
    let (code, out) = s.run("start", &[]);
    assert_eq!(code, OCF_ERR_CONFIGURED, "{out}");
    assert_eq!(s.run("monitor", &[]).0, OCF_NOT_RUNNING);
}

#[test]
fn ocf_tester_passes() {
    if !rdma_testkit::need::tool("ocf-tester") {
        return;
    }
    let s = setup("tester", 5);
    let tester = rdma_testkit::need::which("ocf-tester").unwrap();
    let o = Command::new(tester)
        .env("PATH", path_with_bins())
        // srptd on a NIC of its own, at the test's address.
        .env("NICD_MODE", "own")
        .args(["-n", "srptd-test"])
        .arg("-o")
        .arg(format!("config={}", s.cfg.display()))
        .arg("-o")
        .arg(format!("socket={}", s.sock.display()))
        .arg("-o")
        .arg(format!("pidfile={}", s.dir.join("srptd.pid").display()))
        .arg("-o")
        .arg(format!("logfile={}", s.dir.join("srptd.log").display()))
        .args(["-o", "group=local"])
        .arg(agent())
        .output()
        .unwrap();
    let out = common::text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("passed all tests"), "{out}");
}

/// With `drbd_device`, promote and demote are `srptadm set-role`: srptd
/// opens the DRBD device (a fake: an image file and a status file in
/// /proc/drbd's format saying Secondary) and its following group goes
/// active; demote closes it and the group goes standby.
#[test]
fn agent_promotes_and_demotes_a_drbd_device() {
    let dir = std::env::temp_dir().join(format!("srp-ocf-drbd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("srptd.sock");
    let cfg = dir.join("srptd.toml");
    let img = dir.join("r0.img");
    std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
    let status = dir.join("drbd");
    std::fs::write(
        &status,
        "version: 8.4.11 (api:1/proto:86-101)\n 0: cs:Connected ro:Secondary/Secondary \
         ds:UpToDate/UpToDate C r-----\n",
    )
    .unwrap();
    std::fs::write(
        &cfg,
        format!(
            "[[target]]\nip = \"127.30.2.1\"\nrel_tgt_id = 1\ncontrol_socket = \"{}\"\n\n\
             [drbd]\nstatus_file = \"{}\"\npoll_interval_ms = 0\n\n\
             [[device]]\nname = \"r0\"\nhandler = \"vdisk_blockio\"\nfilename = \"{}\"\ndrbd_minor = 0\n\n\
             [[lun]]\nlun = 0\ndevice = \"r0\"\n\n\
             [[target_group]]\nname = \"local\"\ngroup_id = 1\ntargets = [1]\nfollow = \"r0\"\n",
            sock.display(),
            status.display(),
            img.display()
        ),
    )
    .unwrap();
    let s = Setup { dir, cfg, sock };
    let drbd = [("group", ""), ("drbd_device", "r0")];
    assert_eq!(s.run("validate-all", &drbd).0, OCF_SUCCESS);
    // group and drbd_device together: not configured.
    assert_eq!(
        s.run("validate-all", &[("drbd_device", "r0")]).0,
        OCF_ERR_CONFIGURED
    );
    let (code, out) = s.run("start", &drbd);
    assert_eq!(code, OCF_SUCCESS, "{out}");
    assert_eq!(s.state(), "standby");
    assert_eq!(s.run("monitor", &drbd).0, OCF_SUCCESS);
    let (code, out) = s.run("promote", &drbd);
    assert_eq!(code, OCF_SUCCESS, "{out}");
    assert_eq!(s.state(), "active");
    assert_eq!(s.run("monitor", &drbd).0, OCF_RUNNING_MASTER);
    let (code, out) = s.run("demote", &drbd);
    assert_eq!(code, OCF_SUCCESS, "{out}");
    assert_eq!(s.state(), "standby");
    assert_eq!(s.run("monitor", &drbd).0, OCF_SUCCESS);
    // A device srptd does not follow: not configured.
    assert_eq!(
        s.run("monitor", &[("group", ""), ("drbd_device", "r9")]).0,
        OCF_ERR_CONFIGURED
    );
    assert_eq!(s.run("stop", &drbd).0, OCF_SUCCESS);
}
