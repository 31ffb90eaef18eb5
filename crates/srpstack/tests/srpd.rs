//! The resident initiator as an operator uses it: `srptd` exports two
//! LUNs on 127.0.94.1, `srpd` runs on 127.0.94.2, and `srp login` hands it
//! a Linux ib_srp login string. The LUNs appear as files under srpd's
//! mount root; data written through them reads back; `srp list` shows the
//! channel's credits and the LUNs' state; bad requests are refused with
//! reasons; `srp logout` removes the files and the target sees the
//! session end; login and logout repeat; SIGTERM logs out what is left.
//!
//! Skipped when the machine lacks FUSE, a failure under `CI=true`
//! (`rdma_testkit::need`).

mod common;

use common::{srp, text, wait_for, Proc};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::process::Command;

// srptd's target port ID is the GUID of its address: 0002c903 and 127.0.94.1.
const TARGET: &str = "id_ext=0002c9037f005e01,ioc_guid=0002c9037f005e01,dest=127.0.94.1:5555";

/// Channels `srptd` behind `sock` holds.
fn target_sessions(sock: &Path) -> usize {
    let out = Command::new(common::srptadm_bin())
        .arg("--socket")
        .arg(sock)
        .args(["--json", "sessions"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v.as_array().map_or(0, |a| a.len())
}

#[test]
fn srpd_logs_in_by_login_string_and_shows_luns_as_files() {
    if !rdma_testkit::need::fuse() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("srpd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let root = dir.join("mnt");
    std::fs::create_dir_all(&root).unwrap();
    let tsock = dir.join("srptd.sock");
    let cfg = dir.join("srptd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[target]\nip = \"127.0.94.1\"\ncontrol_socket = \"{}\"\n\n\
             [[device]]\nname = \"ram0\"\nhandler = \"vdisk_nullio\"\nsize = \"16M\"\n\n\
             [[device]]\nname = \"ram1\"\nhandler = \"vdisk_fileio\"\nfilename = \"{}\"\nsize = \"8M\"\n\n\
             [[lun]]\nlun = 0\ndevice = \"ram0\"\n\n[[lun]]\nlun = 3\ndevice = \"ram1\"\n",
            tsock.display(),
            dir.join("lun3.img").display()
        ),
    )
    .unwrap();
    let _target = common::start_srptd(&cfg);
    let sock = dir.join("srpd.sock");
    let mut srpd = common::start_srpd("127.0.94.2", &root, &sock, &["--reconnect-delay", "1"]);

    // Refusals, each with its reason.
    let bad = srp(
        &sock,
        &["login", "id_ext=1,ioc_guid=1,bogus=2,dest=127.0.94.1:5555"],
    );
    assert!(!bad.status.success());
    assert!(text(&bad).contains("bogus"), "{}", text(&bad));
    let nobody = srp(
        &sock,
        &[
            "login",
            "id_ext=1,ioc_guid=1,dest=127.0.94.1:5556",
            "--name",
            "x",
        ],
    );
    assert!(!nobody.status.success(), "{}", text(&nobody));
    assert!(text(&nobody).contains("login"), "{}", text(&nobody));
    let name = srp(&sock, &["login", TARGET, "--name", "../etc"]);
    assert!(text(&name).contains("login name"), "{}", text(&name));
    assert!(
        !root.join("x").exists(),
        "a failed login left its directory"
    );

    for round in 0..3 {
        let login = srp(&sock, &["login", TARGET, "--name", "tgt"]);
        assert!(login.status.success(), "{}", text(&login));
        assert!(
            text(&login).contains("logged in as tgt"),
            "{}",
            text(&login)
        );
        let again = srp(&sock, &["login", TARGET, "--name", "tgt"]);
        assert!(text(&again).contains("exists"), "{}", text(&again));

        let lun0 = root.join("tgt/lun0");
        let lun3 = root.join("tgt/lun3");
        assert_eq!(std::fs::metadata(&lun0).unwrap().len(), 16 << 20);
        assert_eq!(std::fs::metadata(&lun3).unwrap().len(), 8 << 20);

        // Data through the file reaches the fileio image and reads back.
        let pattern: Vec<u8> = (0..65536u32)
            .map(|i| (i.wrapping_mul(31) ^ (round * 7)) as u8)
            .collect();
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&lun3)
            .unwrap();
        f.seek(SeekFrom::Start(1 << 20)).unwrap();
        f.write_all(&pattern).unwrap();
        f.sync_all().unwrap();
        let mut back = vec![0u8; pattern.len()];
        f.seek(SeekFrom::Start(1 << 20)).unwrap();
        f.read_exact(&mut back).unwrap();
        assert!(back == pattern, "read back differs");
        drop(f);
        let mut img = std::fs::File::open(dir.join("lun3.img")).unwrap();
        img.seek(SeekFrom::Start(1 << 20)).unwrap();
        img.read_exact(&mut back).unwrap();
        assert!(back == pattern, "the target's image does not hold the data");

        let list = srp(&sock, &["list", "--json"]);
        assert!(list.status.success(), "{}", text(&list));
        let v: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
        let l = &v[0];
        assert_eq!(l["name"], "tgt", "{v}");
        assert_eq!(l["channels"][0]["closed"], false, "{v}");
        assert!(l["channels"][0]["credits"].as_i64().unwrap() > 0, "{v}");
        assert!(l["channels"][0]["completed"].as_u64().unwrap() > 0, "{v}");
        let luns: Vec<u64> = l["luns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u["lun"].as_u64().unwrap())
            .collect();
        assert_eq!(luns, vec![0, 3], "{v}");
        assert_eq!(l["luns"][1]["state"], "running", "{v}");
        let human = text(&srp(&sock, &["list"]));
        assert!(
            human.contains("credits") && human.contains("lun3"),
            "{human}"
        );
        assert_eq!(target_sessions(&tsock), 1);

        let out = srp(&sock, &["logout", "tgt"]);
        assert!(out.status.success(), "{}", text(&out));
        assert!(!lun0.exists() && !root.join("tgt").exists());
        wait_for("the target to see the logout", 10, || {
            target_sessions(&tsock) == 0
        });
        let none = srp(&sock, &["list"]);
        assert!(text(&none).contains("no logins"), "{}", text(&none));
    }
    let gone = srp(&sock, &["logout", "tgt"]);
    assert!(text(&gone).contains("no login named"), "{}", text(&gone));

    // SIGTERM with a login held: srpd logs it out and unmounts.
    let login = srp(&sock, &["login", TARGET]);
    assert!(text(&login).contains("logged in as t0"), "{}", text(&login));
    assert!(root.join("t0/lun0").exists());
    srpd.term();
    let rest = srpd.rest(30).join("\n");
    assert!(rest.contains("1 logins ended"), "{rest}");
    // Every verbs object the session made went with it (the access layer
    // counts them).
    assert!(rest.contains("; 0 verbs objects left;"), "{rest}");
    assert!(!root.join("t0").exists(), "{rest}");
    wait_for("the target to see srpd leave", 10, || {
        target_sessions(&tsock) == 0
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// Discovery as srp_daemon does it: `srp discover` asks srptd's device
/// management agent for its I/O controller and prints the ib_srp login
/// string; a rules file can deny it; `--login` hands it to srpd, which logs
/// in by IB CM; an address with nobody behind it is reported.
#[test]
fn srp_discover_finds_srptd_and_logs_in_through_srpd() {
    let dir = std::env::temp_dir().join(format!("srp-discover-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let root = dir.join("mnt");
    std::fs::create_dir_all(&root).unwrap();
    let tsock = dir.join("srptd.sock");
    let _target = Proc::start(
        "srptd",
        common::tool(common::srptd_bin())
            .args(["--ip", "127.0.117.1", "--ram-mib", "8"])
            .arg("--control-socket")
            .arg(&tsock),
    );
    _target.wait_line("listening on", 20);

    let discover = |extra: &[&str]| {
        common::tool(common::srp_bin())
            .args(["discover", "--target", "127.0.117.1", "--ip", "127.0.117.2"])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = discover(&["-v"]);
    assert!(out.status.success(), "{}", text(&out));
    let t = text(&out);
    let line = t
        .lines()
        .find(|l| l.starts_with("id_ext="))
        .unwrap_or_else(|| panic!("no login string: {t}"));
    // 127.0.117.1 as an IPv4-mapped GID; ib_srpt's service ID is the
    // GUID, which is srptd's port's: 0002c903 and the address.
    assert_eq!(
        line,
        "id_ext=0002c9037f007501,ioc_guid=0002c9037f007501,\
         dgid=00000000000000000000ffff7f007501,pkey=ffff,service_id=0002c9037f007501"
    );
    assert!(t.contains("class 0x0100"), "{t}");

    // A rules file that denies this ioc_guid prints nothing to log in to.
    let rules = dir.join("rules");
    std::fs::write(&rules, "d ioc_guid=0002c9037f007501\na\n").unwrap();
    let out = discover(&["--rules", rules.to_str().unwrap()]);
    assert!(!text(&out).contains("id_ext="), "{}", text(&out));

    // Nobody at .9: a clear failure.
    let out = common::tool(common::srp_bin())
        .args(["discover", "--target", "127.0.117.9", "--ip", "127.0.117.2"])
        .args(["--timeout-ms", "50"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out).contains("device management query failed"),
        "{}",
        text(&out)
    );

    if !rdma_testkit::need::part("the login part").fuse() {
        return;
    }
    let sock = dir.join("srpd.sock");
    let _srpd = Proc::start(
        "srpd",
        common::tool(common::srpd_bin())
            .args(["--ip", "127.0.117.3"])
            .arg("--mount-root")
            .arg(&root)
            .arg("--control-socket")
            .arg(&sock),
    );
    _srpd.wait_line("srpd: ready on", 20);
    std::fs::write(&rules, "a ioc_guid=0002c9037f007501,queue_size=32\n").unwrap();
    let out = discover(&[
        "--rules",
        rules.to_str().unwrap(),
        "--login",
        "--control-socket",
        sock.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(",queue_size=32"), "{}", text(&out));
    assert!(text(&out).contains("logged in as t0"), "{}", text(&out));
    assert_eq!(
        std::fs::metadata(root.join("t0/lun0")).unwrap().len(),
        8 << 20
    );
    let list = srp(&sock, &["list", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert!(
        v[0]["target"].as_str().unwrap().contains("service_id="),
        "{v}"
    );
    assert_eq!(target_sessions(&tsock), 1);
    let _ = std::fs::remove_dir_all(&dir);
}
