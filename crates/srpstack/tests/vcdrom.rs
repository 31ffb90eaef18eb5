//! A virtual CD-ROM end to end: `srptd` exports an ISO image with handler
//! `vcdrom`, our initiator (`srp fuse`, another process, over soft RoCE on
//! loopback) reads the disc back byte for byte through its LUN file;
//! `srptadm change-medium` puts another image in, which a new login reads,
//! and refuses an image that is not whole 2048-byte blocks.
//!
//! Skipped when the machine lacks FUSE (`rdma_testkit::need`; a failure
//! under `CI=true`).

mod common;

use common::Proc;
use rdma_testkit::need;
use std::path::Path;
use std::process::Command;

/// An image whose every 2048-byte block says which it is (`seed` tells
/// two images apart).
fn image(blocks: u64, seed: u8) -> Vec<u8> {
    (0..blocks * 2048)
        .map(|i| ((i / 2048) as u8).wrapping_mul(seed) ^ (i as u8))
        .collect()
}

/// `srp fuse` of the target at 127.129.29.1 on `mnt`, once mounted.
fn mount(mnt: &Path) -> Proc {
    let p = Proc::start(
        "srp fuse",
        common::tool(common::srp_bin())
            .args([
                "fuse",
                "--dest",
                "127.129.29.1:5555",
                "--ip",
                "127.129.29.2",
                "--mountpoint",
            ])
            .arg(mnt),
    );
    p.wait_line("srp: mounted 1 LUNs", 30);
    p
}

fn unmount(mut p: Proc) {
    p.term();
    p.wait_line("srp: unmounted", 30);
    let status = p.child.wait().unwrap();
    assert!(status.success(), "srp fuse exited {status}");
}

#[test]
fn our_initiator_reads_a_vcdrom_image_byte_for_byte_and_srptadm_changes_the_disc() {
    if !need::fuse() || !need::tool("fusermount3") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("srp-vcdrom-{}", std::process::id()));
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let first = dir.join("first.iso");
    let second = dir.join("second.iso");
    std::fs::write(&first, image(1000, 3)).unwrap();
    std::fs::write(&second, image(600, 5)).unwrap();
    let sock = dir.join("ctl.sock");
    let cfg = dir.join("srptd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[target]\nip = \"127.129.29.1\"\ncontrol_socket = \"{}\"\n\n\
             [[device]]\nname = \"cd0\"\nhandler = \"vcdrom\"\nfilename = \"{}\"\n\n\
             [[lun]]\nlun = 0\ndevice = \"cd0\"\n",
            sock.display(),
            first.display()
        ),
    )
    .unwrap();
    let _target = common::start_srptd(&cfg);

    let fuse = mount(&mnt);
    let back = std::fs::read(mnt.join("lun0")).unwrap();
    assert_eq!(back.len(), 1000 * 2048, "the disc's size");
    assert!(back == image(1000, 3), "the first image, byte for byte");
    unmount(fuse);

    let adm = |args: &[&str]| {
        let o = Command::new(common::srptadm_bin())
            .arg("--socket")
            .arg(&sock)
            .args(args)
            .output()
            .unwrap();
        (o.status.success(), common::text(&o))
    };
    let (ok, out) = adm(&["--json", "devices"]);
    assert!(ok, "{out}");
    let devs: serde_json::Value = serde_json::from_str(&out).unwrap();
    let cd = &devs[0];
    assert_eq!(
        (
            &cd["handler"],
            &cd["size"],
            &cd["block_size"],
            &cd["read_only"]
        ),
        (
            &"vcdrom".into(),
            &(1000 * 2048).into(),
            &2048.into(),
            &true.into()
        ),
        "{cd}"
    );
    let (ok, out) = adm(&["change-medium", "cd0", second.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert!(out.contains("second.iso") && out.contains("28/00"), "{out}");
    let odd = dir.join("odd.iso");
    std::fs::write(&odd, vec![0u8; 3000]).unwrap();
    let (ok, out) = adm(&["change-medium", "cd0", odd.to_str().unwrap()]);
    assert!(!ok, "an odd-sized image was taken: {out}");
    assert!(out.contains("2048-byte"), "{out}");

    // A drive added at run time with no disc, then given one; a RAM
    // device has no disc to change.
    let (ok, out) = adm(&[
        "add-device",
        "cd1",
        "--handler",
        "vcdrom",
        "--threads-num",
        "2",
    ]);
    assert!(ok, "{out}");
    let (ok, out) = adm(&["change-medium", "cd1", first.to_str().unwrap()]);
    assert!(ok, "{out}");
    let (ok, out) = adm(&["--json", "devices"]);
    assert!(ok, "{out}");
    let devs: serde_json::Value = serde_json::from_str(&out).unwrap();
    let cd1 = &devs[1];
    assert_eq!(
        (&cd1["name"], &cd1["size"]),
        (&"cd1".into(), &(1000 * 2048).into()),
        "{cd1}"
    );
    assert_eq!(cd1["threads_num"], 2, "{cd1}");
    let (ok, out) = adm(&["add-device", "r0", "--handler", "ram", "--size", "1M"]);
    assert!(ok, "{out}");
    let (ok, out) = adm(&["change-medium", "r0"]);
    assert!(!ok && out.contains("no disc to change"), "{out}");

    // A reload whose config names another image for cd0 changes the disc
    // (the drive is mapped: it is not rebuilt); a reload naming an image
    // that is not whole blocks is refused and changes nothing.
    let text = std::fs::read_to_string(&cfg).unwrap();
    let third = dir.join("third.iso");
    std::fs::write(&third, image(700, 7)).unwrap();
    std::fs::write(&cfg, text.replace("first.iso", "third.iso")).unwrap();
    let (ok, out) = adm(&["--json", "reload"]);
    assert!(ok, "{out}");
    assert!(out.contains("third.iso"), "{out}");
    std::fs::write(&cfg, text.replace("first.iso", "odd.iso")).unwrap();
    let (ok, out) = adm(&["reload"]);
    assert!(!ok && out.contains("2048-byte"), "{out}");
    let (_, out) = adm(&["--json", "devices"]);
    let devs: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(devs[0]["size"], 700 * 2048, "{out}");
    std::fs::write(&cfg, text.replace("first.iso", "second.iso")).unwrap();
    let (ok, out) = adm(&["reload"]);
    assert!(ok, "{out}");

    // The second disc (the bad one left it in), read by a new login.
    let fuse = mount(&mnt);
    let back = std::fs::read(mnt.join("lun0")).unwrap();
    assert!(back == image(600, 5), "the second image, byte for byte");
    unmount(fuse);
    let _ = std::fs::remove_dir_all(&dir);
}
