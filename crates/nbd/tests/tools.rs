//! Real NBD clients against the server: qemu-img (qemu-utils), nbdinfo and
//! nbdcopy (libnbd-bin), fio's nbd engine. A test whose tool is not
//! installed is skipped, or fails under `CI=true` (`rdma_testkit::need`).

mod common;

use blockload::{BlockDevice, RamDevice};
use common::{have, pattern, run, write_file, TempDir};
use nbd::{Export, Server, ServerHandle};
use std::process::Command as Process;
use std::sync::Arc;

const MIB: u64 = 1 << 20;

fn serve(bs: u32, bytes: u64, name: &str) -> (ServerHandle, Arc<RamDevice>) {
    let dev = Arc::new(RamDevice::new(bs, bytes / u64::from(bs)));
    let h = Server::bind_tcp("127.0.0.1:0", Export::new(name, dev.clone()))
        .unwrap()
        .spawn()
        .unwrap();
    (h, dev)
}

fn device_bytes(dev: &RamDevice) -> Vec<u8> {
    let mut all = vec![0u8; (dev.num_blocks() * u64::from(dev.block_size())) as usize];
    dev.read_at(0, &mut all).unwrap();
    all
}

#[test]
fn qemu_img_info_convert_compare() {
    if !have("qemu-img") {
        return;
    }
    // 4096-byte blocks: qemu's 512-byte-aligned I/O exercises the
    // read-modify-write path.
    let (h, dev) = serve(4096, 16 * MIB, "disk");
    let uri = h.uri();
    assert!(uri.ends_with("/disk"), "{uri}");
    let info = run("qemu-img", &["info", "--output=json", &uri]);
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["virtual-size"], 16 * MIB, "{info}");
    // The default export name reaches the same export.
    let default_uri = uri.trim_end_matches("disk").to_string();
    assert!(run("qemu-img", &["info", &default_uri]).contains("16 MiB"));

    let dir = TempDir::new("qemu");
    let src = dir.path("src.raw");
    // Data with holes: qemu-img skips zero runs (write-zeroes or nothing).
    let mut data = pattern(11, 0, (16 * MIB) as usize);
    data[(3 * MIB) as usize..(5 * MIB) as usize].fill(0);
    data[12345..23456].fill(0);
    write_file(&src, &data);
    // -n: the target exists; the file is written over our export.
    run(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            src.to_str().unwrap(),
            &uri,
        ],
    );
    assert!(
        device_bytes(&dev) == data,
        "device content differs from the source file"
    );
    let cmp = run(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            src.to_str().unwrap(),
            &uri,
        ],
    );
    assert!(cmp.contains("Images are identical"), "{cmp}");
    // A change on the device shows up as a difference.
    dev.write_at(100, &[0xee; 4096]).unwrap();
    let out = Process::new("qemu-img")
        .args([
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            src.to_str().unwrap(),
            &uri,
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(h.stats().protocol_errors, 0);
}

#[test]
fn nbdinfo_and_nbdcopy() {
    if !have("nbdinfo") || !have("nbdcopy") {
        return;
    }
    let (h, dev) = serve(512, 8 * MIB, "lun");
    let uri = h.uri();
    let info: serde_json::Value = serde_json::from_str(&run("nbdinfo", &["--json", &uri])).unwrap();
    let e = &info["exports"][0];
    assert_eq!(e["export-size"], 8 * MIB, "{info}");
    assert_eq!(e["is_read_only"], false, "{info}");
    assert_eq!(e["can_flush"], true, "{info}");
    assert_eq!(e["can_fua"], true, "{info}");
    assert_eq!(e["can_trim"], true, "{info}");
    assert_eq!(e["can_zero"], true, "{info}");
    assert_eq!(e["can_multi_conn"], true, "{info}");
    assert_eq!(e["block_size_minimum"], 1, "{info}");
    assert_eq!(e["block_size_maximum"], 32 * MIB, "{info}");
    let list = run("nbdinfo", &["--list", "--json", &uri]);
    assert!(list.contains("\"lun\""), "{list}");

    let dir = TempDir::new("nbdcopy");
    let src = dir.path("src.raw");
    let back = dir.path("back.raw");
    let data = pattern(12, 0, (8 * MIB) as usize);
    write_file(&src, &data);
    // nbdcopy opens several connections because CAN_MULTI_CONN is set.
    run("nbdcopy", &["--flush", src.to_str().unwrap(), &uri]);
    assert!(
        device_bytes(&dev) == data,
        "device content differs after nbdcopy"
    );
    run("nbdcopy", &[&uri, back.to_str().unwrap()]);
    assert!(std::fs::read(&back).unwrap() == data, "copy back differs");
    assert!(h.stats().accepted >= 3, "{:?}", h.stats());
    assert_eq!(h.stats().protocol_errors, 0);
    h.shutdown();

    // The same over a Unix socket, through the URI the handle gives.
    let sock = dir.path("nbd.sock");
    let h = Server::bind_unix(&sock, Export::new("u", dev))
        .unwrap()
        .spawn()
        .unwrap();
    let size = run("nbdinfo", &["--size", &h.uri()]);
    assert_eq!(size.trim(), (8 * MIB).to_string());
    run("nbdcopy", &[&h.uri(), back.to_str().unwrap()]);
    assert!(
        std::fs::read(&back).unwrap() == data,
        "copy over the Unix socket differs"
    );
}

#[test]
fn fio_nbd_engine_randrw_verify() {
    if !have("fio") {
        return;
    }
    let help = Process::new("fio").arg("--enghelp").output().unwrap();
    let engine = String::from_utf8_lossy(&help.stdout)
        .lines()
        .any(|l| l.trim() == "nbd");
    if !rdma_testkit::need::have(
        "fio's nbd engine",
        (!engine).then(|| "this fio was built without it".into()),
        "apt-get install fio (Debian's fio has it)",
    ) {
        return;
    }
    let (h, dev) = serve(512, 16 * MIB, "");
    let dir = TempDir::new("fio");
    let uri = format!("--uri={}", h.uri());
    let directory = format!("--directory={}", dir.0.display());
    let fio = |extra: &[&str]| {
        let mut args = vec![
            "--name=nbd",
            "--ioengine=nbd",
            &uri,
            "--bs=4k",
            "--size=16m",
            "--iodepth=8",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--output-format=json",
            &directory,
        ];
        args.extend_from_slice(extra);
        let out = Process::new("fio").args(&args).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let json: serde_json::Value = match stdout.find('{') {
            Some(at) => serde_json::from_str(&stdout[at..]).unwrap_or_default(),
            None => serde_json::Value::Null,
        };
        let job = json["jobs"][0].clone();
        let (r, w) = (
            job["read"]["io_bytes"].as_u64().unwrap_or(0),
            job["write"]["io_bytes"].as_u64().unwrap_or(0),
        );
        println!(
            "fio {extra:?}: exit {}, error {}, read {r}, wrote {w}",
            out.status, job["error"]
        );
        (
            out.status.success() && job["error"] == 0,
            r,
            w,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // The workload of the brief: random mixed I/O, then verification.
    let (ok, read, written, err) = fio(&["--rw=randrw", "--do_verify=1"]);
    assert!(ok, "{err}");
    assert!(
        written > 0 && read > written,
        "read {read}, wrote {written}"
    );
    // Random writes then verify: every read is a verification read, so
    // exactly the written bytes were read back and checked.
    let (ok, read, written, err) = fio(&["--rw=randwrite", "--do_verify=1"]);
    assert!(ok, "{err}");
    assert_eq!((read, written), (16 * MIB, 16 * MIB));
    // Verification is real: a verify-only pass succeeds, and fails once
    // one block is corrupted behind fio's back.
    let (ok, read, _, err) = fio(&["--rw=randwrite", "--verify_only=1"]);
    assert!(ok && read == 16 * MIB, "{err}");
    dev.write_at(5 * 8 + 1, &[0x5a; 512]).unwrap();
    let (ok, _, _, _) = fio(&["--rw=randwrite", "--verify_only=1"]);
    assert!(!ok, "fio did not notice a corrupted block");
    assert_eq!(h.stats().protocol_errors, 0);
}
