//! A remote LUN as a file: `srptd` in one process, `srp fuse` in another
//! (both on loopback addresses over the soft RoCE NIC), fio verifying
//! through the FUSE file, and ext4 on a loop device over it.
//!
//! Skipped when the machine lacks FUSE, fio or loop devices, a failure
//! under `CI=true` (`rdma_testkit::need`); `.ci/run` installs them.

mod common;

use common::Proc;
use rdma_testkit::need;
use std::path::PathBuf;
use std::process::{Command, Output};

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run tool")
}

fn ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Detaches the loop device and unmounts whatever is left, on any exit.
struct Cleanup {
    loopdev: Option<String>,
    fsmount: Option<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(m) = &self.fsmount {
            let _ = Command::new("umount").arg(m).status();
        }
        if let Some(d) = &self.loopdev {
            let _ = Command::new("losetup").args(["-d", d]).status();
        }
    }
}

/// fio's JSON report; engines may print notices before it.
fn fio_json(stdout: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(stdout);
    let at = text.find("\n{").map_or(0, |i| i + 1);
    serde_json::from_str(&text[at..]).unwrap_or_else(|e| panic!("fio JSON: {e}\n{text}"))
}

/// fio randrw over 16 MiB with crc32c verification, the target given by
/// `target` (file or engine options); asserts no errors and all bytes moved.
fn fio_verify(what: &str, target: &[&str]) {
    let out = run(Command::new("fio")
        .args(["--name=srp", "--rw=randrw", "--bs=4k", "--size=16m"])
        .args(target)
        .args(["--verify=crc32c", "--do_verify=1", "--verify_state_save=0"])
        .arg("--output-format=json"));
    ok(&out, what);
    let v = fio_json(&out.stdout);
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    let bytes =
        job["read"]["io_bytes"].as_u64().unwrap() + job["write"]["io_bytes"].as_u64().unwrap();
    assert!(bytes >= 16 << 20, "fio moved {bytes} bytes");
}

#[test]
fn fio_and_ext4_on_a_remote_lun_through_fuse() {
    if !need::fuse() || !need::tools(&["fusermount3", "fio"]) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("srp-fuse-{}", std::process::id()));
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let cfg = dir.join("srptd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[target]\nip = \"127.0.96.1\"\ncontrol_socket = \"{}\"\n\n\
             [[device]]\nname = \"d0\"\nhandler = \"vdisk_fileio\"\nfilename = \"{}\"\nsize = \"64M\"\n\n\
             [[lun]]\nlun = 0\ndevice = \"d0\"\n",
            dir.join("ctl.sock").display(),
            dir.join("d0.img").display()
        ),
    )
    .unwrap();
    let _target = Proc::start(
        "srptd",
        common::tool(common::srptd_bin()).arg("--config").arg(&cfg),
    );
    _target.wait_line("listening on", 20);
    let mut fuse = Proc::start(
        "srp fuse",
        common::tool(common::srp_bin())
            .args([
                "fuse",
                "--dest",
                "127.0.96.1:5555",
                "--ip",
                "127.0.96.2",
                "--mountpoint",
            ])
            .arg(&mnt),
    );
    fuse.wait_line("srp: mounted 1 LUNs", 30);
    let file = mnt.join("lun0");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 64 << 20);

    let filename = format!("--filename={}", file.display());
    fio_verify(
        "fio on the FUSE file",
        &[&filename, "--direct=1", "--ioengine=psync"],
    );

    let mut clean = Cleanup {
        loopdev: None,
        fsmount: None,
    };
    let tools = [
        "losetup",
        "mkfs.ext4",
        "fsck.ext4",
        "mount",
        "umount",
        "sha1sum",
    ];
    let ext4 = need::part("the ext4 part");
    if ext4.tools(&tools) {
        let out = run(Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&file));
        let err = String::from_utf8_lossy(&out.stderr);
        if ext4.have(
            "a loop device",
            (!out.status.success()).then(|| format!("losetup cannot attach: {}", err.trim())),
            "root and /dev/loop-control (modprobe loop)",
        ) {
            let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
            clean.loopdev = Some(dev.clone());
            ok(
                &run(Command::new("mkfs.ext4").args(["-q", "-F", &dev])),
                "mkfs.ext4",
            );
            let fsdir = dir.join("fs");
            std::fs::create_dir_all(&fsdir).unwrap();
            ok(&run(Command::new("mount").arg(&dev).arg(&fsdir)), "mount");
            clean.fsmount = Some(fsdir.clone());
            // Files with known contents, then their checksums after a remount.
            let mut want = Vec::new();
            for i in 0..4u32 {
                let data: Vec<u8> = (0..(1u32 << 20) + i * 4093)
                    .map(|j| (j.wrapping_mul(2_654_435_761) >> 13) as u8 ^ i as u8)
                    .collect();
                std::fs::write(fsdir.join(format!("f{i}")), &data).unwrap();
                want.push(data);
            }
            ok(&run(Command::new("umount").arg(&fsdir)), "umount");
            clean.fsmount = None;
            ok(
                &run(Command::new("fsck.ext4").args(["-fn", &dev])),
                "fsck.ext4 -fn",
            );
            ok(
                &run(Command::new("mount").arg(&dev).arg(&fsdir)),
                "mount again",
            );
            clean.fsmount = Some(fsdir.clone());
            for (i, data) in want.iter().enumerate() {
                let got = std::fs::read(fsdir.join(format!("f{i}"))).unwrap();
                assert!(got == *data, "file f{i} changed across a remount");
            }
            ok(&run(Command::new("umount").arg(&fsdir)), "umount");
            clean.fsmount = None;
            ok(
                &run(Command::new("losetup").args(["-d", &dev])),
                "losetup -d",
            );
            clean.loopdev = None;
        }
    }
    drop(clean);
    fuse.term();
    fuse.wait_line("srp: unmounted", 30);
    let status = fuse.child.wait().unwrap();
    assert!(status.success(), "srp fuse exited {status}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// fio and its nbd engine, or the test is skipped (`need`).
fn fio_with_nbd() -> bool {
    if !need::tool("fio") {
        return false;
    }
    let engine = Command::new("fio")
        .arg("--enghelp")
        .output()
        .is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.trim() == "nbd")
        });
    need::have(
        "fio's nbd engine",
        (!engine).then(|| "this fio was built without it".into()),
        "apt-get install fio (Debian's fio has it)",
    )
}

#[test]
fn fio_nbd_engine_and_qemu_img_on_a_remote_lun() {
    if !fio_with_nbd() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("srp-nbd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let target = Proc::start(
        "srptd",
        common::tool(common::srptd_bin())
            .args(["--ip", "127.0.96.5", "--ram-mib", "32", "--control-socket"])
            .arg(dir.join("ctl.sock")),
    );
    target.wait_line("listening on", 20);
    let mut srv = Proc::start(
        "srp nbd",
        common::tool(common::srp_bin()).args([
            "nbd",
            "--dest",
            "127.0.96.5:5555",
            "--ip",
            "127.0.96.6",
            "--listen",
            "127.0.0.1:0",
        ]),
    );
    let line = srv.wait_line("served at nbd://", 30);
    let uri = line.split(" served at ").nth(1).unwrap().trim().to_string();

    let uri_opt = format!("--uri={uri}");
    fio_verify(
        "fio nbd engine",
        &["--ioengine=nbd", &uri_opt, "--iodepth=8"],
    );

    if need::part("the qemu-img part").tool("qemu-img") {
        // A file copied into the LUN compares equal, one byte changed does not.
        let img = dir.join("src.raw");
        let data: Vec<u8> = (0..32u32 << 20)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        std::fs::write(&img, &data).unwrap();
        ok(
            &run(Command::new("qemu-img")
                .args(["convert", "-n", "-f", "raw", "-O", "raw"])
                .arg(&img)
                .arg(&uri)),
            "qemu-img convert",
        );
        ok(
            &run(Command::new("qemu-img")
                .args(["compare", "-f", "raw", "-F", "raw"])
                .arg(&img)
                .arg(&uri)),
            "qemu-img compare",
        );
        let mut changed = data;
        changed[12345] ^= 0xff;
        std::fs::write(&img, &changed).unwrap();
        let out = run(Command::new("qemu-img")
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(&img)
            .arg(&uri));
        assert_eq!(
            out.status.code(),
            Some(1),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    srv.term();
    srv.wait_line("NBD stopped", 30);
    assert!(srv.child.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
}
