//! srptd follows a DRBD role (issue 30 item 2), with a fake role source:
//! a file in DRBD 8.4's `/proc/drbd` format in a temp dir, which the test
//! rewrites as `drbdadm primary`/`secondary` would change the real one.
//! The LUN is a vdisk_blockio device on an image file (O_DIRECT, as on
//! `/dev/drbd0`); our initiator logs in from this process on 127.30.1.2
//! to srptd on 127.30.1.1.
//!
//! Shown: while Secondary a WRITE is refused (NOT READY 04/0B) and the
//! image keeps its bytes, READ CAPACITY still answers; the status file
//! saying Primary opens the device and the group goes active, every
//! session told by ASYMMETRIC ACCESS STATE CHANGED (2A/06); `srptadm
//! set-role r0 secondary` under a stream of writes returns after the
//! writes in flight finished, every write acknowledged GOOD is in the
//! image, and nothing written after it returns reaches the image.

mod common;

use common::{srptadm, srptadm_json};
use rdma_access::CmAgent;
use rdma_types::Guid;
use rnic::softroce::{SoftCa, SoftRoce, ROCE_PORT};
use serde_json::Value;
use srp::initiator::ChannelConfig;
use srp_initiator::session::{CmdResult, Session, SessionConfig, Xfer};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BS: usize = 512;
const IMAGE: usize = 4 << 20;

fn status(role: &str) -> String {
    let peer = if role == "Primary" {
        "Secondary"
    } else {
        "Primary"
    };
    format!(
        "version: 8.4.11 (api:1/proto:86-101)\nsrcversion: 211FB288A383ED945B83420\n\n \
         0: cs:Connected ro:{role}/{peer} ds:UpToDate/UpToDate C r-----\n    \
         ns:0 nr:0 dw:0 dr:0 al:0 bm:0 lo:0 pe:0 ua:0 ap:0 ep:1 wo:f oos:0\n"
    )
}

/// Rewrites the status file whole (a rename: the poller never reads half).
fn set_status(dir: &Path, role: &str) {
    let tmp = dir.join("drbd.tmp");
    std::fs::write(&tmp, status(role)).unwrap();
    std::fs::rename(&tmp, dir.join("drbd")).unwrap();
}

/// (sense key, ASC, ASCQ) of a CHECK CONDITION's fixed-format sense.
fn sense(r: &CmdResult) -> Option<(u8, u8, u8)> {
    (r.sense.len() >= 14).then(|| (r.sense[2] & 0xf, r.sense[12], r.sense[13]))
}

fn write10(lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = 0x2a;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// A block that names its LBA and the pass that wrote it.
fn stamp(lba: u32, pass: u32) -> Vec<u8> {
    let mut b = vec![0u8; BS];
    for (i, c) in b.chunks_mut(8).enumerate() {
        c[..4].copy_from_slice(&lba.to_be_bytes());
        c[4..].copy_from_slice(&(pass ^ i as u32).to_be_bytes());
    }
    b
}

fn image_block(img: &Path, lba: u32) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut b = vec![0u8; BS];
    std::fs::File::open(img)
        .unwrap()
        .read_exact_at(&mut b, lba as u64 * BS as u64)
        .unwrap();
    b
}

fn roles(sock: &Path) -> Value {
    srptadm_json(sock, &["roles"])["devices"][0].clone()
}

fn states(sock: &Path) -> (String, String) {
    let g = srptadm_json(sock, &["target-groups"]);
    let s = |i: usize| g["groups"][i]["state"].as_str().unwrap_or("?").to_string();
    (s(0), s(1))
}

#[test]
fn srptd_serves_a_drbd_lun_only_while_primary_and_drains_on_demotion() {
    let dir = std::env::temp_dir().join(format!("srp-drbd-role-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("srptd.sock");
    let cfg = dir.join("srptd.toml");
    let img = dir.join("r0.img");
    std::fs::write(&img, vec![0u8; IMAGE]).unwrap();
    set_status(&dir, "Secondary");
    let text = format!(
        "[[target]]\nip = \"127.30.1.1\"\nrel_tgt_id = 1\ncontrol_socket = \"{sock}\"\n\n\
         [drbd]\nstatus_file = \"{status}\"\npoll_interval_ms = 50\ndrain_ms = \"20s\"\n\n\
         [[device]]\nname = \"r0\"\nhandler = \"vdisk_blockio\"\nfilename = \"{img}\"\n\
         usn = \"drbd-r0\"\ndrbd_minor = 0\n\n\
         [[lun]]\nlun = 0\ndevice = \"r0\"\n\n\
         [[target_group]]\nname = \"here\"\ngroup_id = 1\ntargets = [1]\nfollow = \"r0\"\n\n\
         [[target_group]]\nname = \"peer\"\ngroup_id = 2\ntargets = [2]\nfollow = \"r0\"\n",
        sock = sock.display(),
        status = dir.join("drbd").display(),
        img = img.display(),
    );
    std::fs::write(&cfg, &text).unwrap();
    let check = |path: &Path| {
        common::run(
            common::tool(common::srptd_bin())
                .args(["--check", "--config"])
                .arg(path),
        )
    };
    let (ok, out) = check(&cfg);
    assert!(ok, "{out}");
    // A group that follows a device without drbd_minor: file, line, key.
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, text.replace("drbd_minor = 0\n", "")).unwrap();
    let (ok, out) = check(&bad);
    assert!(!ok, "{out}");
    assert!(
        out.contains("bad.toml:25: target_group[0].follow: device `r0` has no drbd_minor"),
        "{out}"
    );

    let _d = common::start_srptd(&cfg);
    let r = roles(&sock);
    assert_eq!(
        (&r["open"], &r["following"]),
        (&Value::Bool(false), &Value::from("secondary")),
        "{r}"
    );
    assert_eq!(states(&sock), ("standby".into(), "active".into()));
    // A followed group's state is the role's, not srptadm's to set.
    let (ok, out) = srptadm(&sock, &["set-group-state", "here", "active"]);
    assert!(!ok && out.contains("follows DRBD device `r0`"), "{out}");

    let guid = Guid(0x0002_c903_7f1e_0102);
    let p = SoftRoce::new(
        vec![SoftCa {
            guid,
            ip: "127.30.1.2".parse().unwrap(),
        }],
        ROCE_PORT,
    );
    let agent = CmAgent::start(p.clone(), guid, 0x3002).unwrap();
    let target = 0x0002_c903_7f1e_0101;
    let mut scfg = SessionConfig::new(ChannelConfig::new(1, guid, target, Guid(target)));
    scfg.pool_bytes = 1 << 20;
    let connector = Arc::new(srp_initiator::connectors::RdmaCmConnector {
        agent,
        src: "127.30.1.2".parse().unwrap(),
        dst: "127.30.1.1:5555".parse().unwrap(),
        timeout: Duration::from_secs(10),
    });
    let session = Session::connect(p, guid, connector, scfg).unwrap();
    let lun0 = srp::wire::Lun::from_u64(0);
    let tur = session.execute(lun0, &[0u8; 6], Xfer::None).unwrap();
    assert_eq!(sense(&tur).map(|s| s.0), Some(6), "power-on UA: {tur:?}");

    // Secondary: no write reaches the image; the size still answers.
    let w = session
        .execute(lun0, &write10(7, 1), Xfer::Out(&stamp(7, 1)))
        .unwrap();
    assert_eq!(sense(&w), Some((2, 0x04, 0x0b)), "{w:?}");
    assert_eq!(image_block(&img, 7), vec![0u8; BS]);
    let cap = session
        .execute(lun0, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], Xfer::In(8))
        .unwrap();
    assert!(cap.good(), "{cap:?}");
    assert_eq!(
        u32::from_be_bytes(cap.data[..4].try_into().unwrap()),
        (IMAGE / BS - 1) as u32
    );

    // drbdadm primary: the poller opens the device, the group goes active.
    set_status(&dir, "Primary");
    common::wait_for("srptd to open r0", 20, || roles(&sock)["open"] == true);
    assert_eq!(states(&sock), ("active".into(), "standby".into()));
    let w = session
        .execute(lun0, &write10(7, 1), Xfer::Out(&stamp(7, 1)))
        .unwrap();
    assert_eq!(
        sense(&w),
        Some((6, 0x2a, 0x06)),
        "the change is told: {w:?}"
    );
    let w = session
        .execute(lun0, &write10(7, 1), Xfer::Out(&stamp(7, 1)))
        .unwrap();
    assert!(w.good(), "{w:?}");
    assert_eq!(image_block(&img, 7), stamp(7, 1));

    // The OCF agent's demote under a stream of writes, each to its own
    // LBA: set-role returns once those in flight are done.
    let acked = std::sync::Mutex::new(Vec::<u32>::new());
    let refused = std::sync::Mutex::new(Vec::<(u8, u8, u8)>::new());
    let stop = AtomicBool::new(false);
    let after = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let end = Instant::now() + Duration::from_secs(60);
            for lba in 100u32..(IMAGE / BS) as u32 {
                if stop.load(Ordering::Relaxed) || Instant::now() > end {
                    break;
                }
                let r = session
                    .execute(lun0, &write10(lba, 1), Xfer::Out(&stamp(lba, 2)))
                    .unwrap();
                if r.good() {
                    acked.lock().unwrap().push(lba);
                } else {
                    refused.lock().unwrap().push(sense(&r).unwrap_or_default());
                }
            }
        });
        common::wait_for("writes before the demotion", 30, || {
            acked.lock().unwrap().len() >= 50
        });
        let (ok, out) = srptadm(&sock, &["set-role", "r0", "secondary"]);
        assert!(ok, "{out}");
        assert!(out.contains("closed"), "{out}");
        // What the image holds the moment set-role returned.
        let after = std::fs::read(&img).unwrap();
        let n = refused.lock().unwrap().len();
        common::wait_for("writes refused after the demotion", 30, || {
            refused.lock().unwrap().len() >= n + 20
        });
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        after
    });
    let acked = acked.into_inner().unwrap();
    let refused = refused.into_inner().unwrap();
    // Every acknowledged write is in the image, and the image did not
    // change after set-role returned: nothing served while Secondary.
    for &lba in &acked {
        assert_eq!(
            image_block(&img, lba),
            stamp(lba, 2),
            "acknowledged LBA {lba}"
        );
    }
    assert_eq!(
        std::fs::read(&img).unwrap(),
        after,
        "the image changed after the demotion"
    );
    // Refusals are the transition (04/0A), the standby state (04/0B)
    // or the unit attention telling of them (2A/06); nothing else.
    for s in &refused {
        assert!(
            matches!(s, (2, 0x04, 0x0a) | (2, 0x04, 0x0b) | (6, 0x2a, 0x06)),
            "{s:?} among {refused:?}"
        );
    }
    assert!(refused.contains(&(2, 0x04, 0x0b)), "{refused:?}");
    let r = roles(&sock);
    assert_eq!(r["open"], false, "{r}");
    assert_eq!(states(&sock), ("standby".into(), "active".into()));

    // The file still says Primary: the poller does not open it again;
    // after drbdadm secondary and primary it does.
    set_status(&dir, "Secondary");
    common::wait_for("the poller to read Secondary", 20, || {
        roles(&sock)["status_file_says"] == "secondary"
    });
    assert_eq!(roles(&sock)["open"], false);
    set_status(&dir, "Primary");
    common::wait_for("srptd to open r0 again", 20, || {
        roles(&sock)["open"] == true
    });
    session.close();
    let _ = std::fs::remove_dir_all(&dir);
}
