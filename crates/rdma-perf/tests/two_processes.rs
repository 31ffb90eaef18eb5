//! rperf as two real processes on loopback addresses: data verified with
//! and without injected loss, and a capture of the client's traffic that
//! our parser and tshark decode packet by packet.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn rperf() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rperf"));
    c.env("NICD_MODE", "own");
    c
}

/// Starts a server and waits (bounded) for the line saying it listens.
fn server(ip: &str, oob: u16, extra: &[&str]) -> Child {
    let mut child = rperf()
        .args([
            "server",
            "--bind",
            &format!("{ip}:4791"),
            "--oob",
            &format!("{ip}:{oob}"),
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn rperf server");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("rperf server never said it listens");
    assert!(
        line.contains("listening"),
        "unexpected server output: {line}"
    );
    child
}

/// Waits (bounded) for a server to end after its client's run, and checks
/// it ended well: a server that failed (its own checks, a crash) fails the
/// test even when its client was content.
fn server_done(mut s: Child) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = s.try_wait().unwrap() {
            assert!(status.success(), "rperf server exited with {status}");
            return;
        }
        if Instant::now() > deadline {
            let _ = s.kill();
            panic!("rperf server did not end after its client");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a client to completion (bounded) and returns its JSON report.
fn client(ip: &str, server_ip: &str, oob: u16, args: &[&str]) -> serde_json::Value {
    let mut child = rperf()
        .args([
            "client",
            "--bind",
            &format!("{ip}:4791"),
            "--server",
            &format!("{server_ip}:{oob}"),
            "--json",
            "--verify",
        ])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rperf client");
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            assert!(
                status.success(),
                "rperf client failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            return serde_json::from_slice(&out.stdout).expect("JSON report");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("rperf client did not finish in time");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run(pair: u8, op: &str, mib: u64, faults: Option<&str>) -> serde_json::Value {
    let (cip, sip) = (format!("127.0.{pair}.1"), format!("127.0.{pair}.2"));
    let oob = 18500 + u16::from(pair);
    let mut sargs: Vec<&str> = vec![];
    let mut cargs: Vec<String> = vec![
        "--op".into(),
        op.into(),
        "--size".into(),
        "65536".into(),
        "--qd".into(),
        "16".into(),
        "--iters".into(),
        (mib * 16).to_string(),
    ];
    let sf;
    if let Some(f) = faults {
        sf = format!("{f},seed=11");
        sargs.extend(["--faults", &sf]);
        cargs.extend(["--faults".into(), format!("{f},seed=12")]);
    }
    let s = server(&sip, oob, &sargs);
    let cargs: Vec<&str> = cargs.iter().map(String::as_str).collect();
    let report = client(&cip, &sip, oob, &cargs);
    server_done(s);
    report
}

#[test]
fn write_and_read_verified_on_a_clean_link() {
    for (i, op) in ["write", "read", "send"].into_iter().enumerate() {
        let r = run(10 + i as u8, op, 16, None);
        assert_eq!(r["verified"], true, "{op}: {r}");
        assert_eq!(r["iters"], 256);
        assert!(r["gbit_per_s"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn write_and_read_verified_through_one_percent_loss() {
    for (i, op) in ["write", "read"].into_iter().enumerate() {
        let r = run(20 + i as u8, op, 16, Some("loss=0.01"));
        assert_eq!(r["verified"], true, "{op}: {r}");
        assert!(
            r["retransmits"].as_u64().unwrap() > 0,
            "{op}: loss caused retransmissions: {r}"
        );
    }
}

#[test]
#[ignore = "1 GiB each way; run with --release -- --ignored (takes ~10 s in release)"]
fn one_gib_of_writes_and_reads_with_and_without_loss() {
    for (i, (op, faults)) in [
        ("write", None),
        ("read", None),
        ("write", Some("loss=0.01")),
        ("read", Some("loss=0.01")),
    ]
    .into_iter()
    .enumerate()
    {
        let r = run(30 + i as u8, op, 1024, faults);
        assert_eq!(r["verified"], true, "{op} {faults:?}: {r}");
        eprintln!(
            "{op} {faults:?}: {:.3} Gb/s, {} retransmits",
            r["gbit_per_s"].as_f64().unwrap(),
            r["retransmits"]
        );
    }
}

#[test]
fn capture_of_the_client_decodes_in_tshark_with_our_icrcs() {
    let dir = std::env::temp_dir().join(format!("rperf-cap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cap = dir.join("client.pcap");
    let (cip, sip, oob) = ("127.0.40.1", "127.0.40.2", 18540);
    let s = server(sip, oob, &[]);
    let cap_s = cap.to_str().unwrap();
    let r = client(
        cip,
        sip,
        oob,
        &[
            "--op",
            "write",
            "--size",
            "6000",
            "--qd",
            "2",
            "--iters",
            "20",
            "--mtu",
            "1024",
            "--capture",
            cap_s,
        ],
    );
    server_done(s);
    assert_eq!(r["verified"], true);
    let bytes = std::fs::read(&cap).unwrap();
    // Our reading: every record an IPv4 RoCEv2 packet whose ICRC we compute.
    let (_, records) = rdma_wire::pcap::read(&bytes).unwrap();
    let ops: Vec<(u8, u32, bool)> = records.iter().map(|r| rdma_wire_parse(r.data)).collect();
    // 20 WRITEs of 6000 B at MTU 1024: FIRST, 4 MIDDLE, LAST each = 120
    // request packets, PSNs consecutive; the rest are ACKs.
    let writes: Vec<&(u8, u32, bool)> = ops
        .iter()
        .filter(|o| (0x06..=0x08).contains(&o.0))
        .collect();
    assert_eq!(writes.len(), 120);
    for w in writes.windows(2) {
        assert_eq!(w[1].1, (w[0].1 + 1) & 0xFF_FFFF, "PSNs follow each other");
    }
    let pattern: Vec<u8> = writes.iter().take(6).map(|w| w.0).collect();
    assert_eq!(pattern, vec![0x06, 0x07, 0x07, 0x07, 0x07, 0x08]);
    // AckReq on a LAST unless another WRITE was queued behind it (its ACK
    // covers both): the last WRITE of the run always asks, and a LAST that
    // did not ask is followed by the next WRITE's FIRST.
    assert!(writes.last().unwrap().2, "the last WRITE's LAST asks");
    for w in writes.windows(2) {
        if w[0].0 == 0x08 && !w[0].2 {
            assert_eq!(
                w[1].0, 0x06,
                "a LAST that asked nothing had a WRITE behind it"
            );
        }
    }
    // ACKs are coalesced: one per request that asked (at most the 20 LASTs),
    // each repeated at most once when nothing newer follows it within
    // 2 ms (the responder's guard against a lost last ACK), far fewer
    // than the 120 packets.
    let acks = ops.iter().filter(|o| o.0 == 0x11).count();
    assert!((1..=40).contains(&acks), "coalesced ACKs: {acks}");
    let fields = [
        "infiniband.bth.opcode",
        "infiniband.bth.psn",
        "infiniband.aeth.syndrome",
    ];
    if let Some(rows) = rdma_testkit::tshark_fields(
        "capture_of_the_client_decodes_in_tshark_with_our_icrcs",
        &cap,
        &[],
        &fields,
    ) {
        assert_eq!(rows.len(), ops.len(), "tshark saw every packet");
        for (row, op) in rows.iter().zip(&ops) {
            assert_eq!(row[0], op.0.to_string(), "opcode: {row:?}");
            assert_eq!(row[1], op.1.to_string(), "PSN: {row:?}");
            if op.0 == 0x11 {
                assert!(!row[2].is_empty(), "ACK has an AETH: {row:?}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Parses one captured IP packet (checking its ICRC) into (opcode, PSN, AckReq).
fn rdma_wire_parse(ip_packet: &[u8]) -> (u8, u32, bool) {
    let r = rdma_wire::RoceRepr::parse(ip_packet).expect("parses with a good ICRC");
    (
        r.ib.bth.opcode.code(),
        r.ib.bth.psn.value(),
        r.ib.bth.ack_req,
    )
}

#[test]
fn bidirectional_writes_verified() {
    let (cip, sip, oob) = ("127.0.45.1", "127.0.45.2", 18545);
    let s = server(sip, oob, &[]);
    let r = client(
        cip,
        sip,
        oob,
        &[
            "--op", "write", "--size", "65536", "--qd", "8", "--iters", "128", "--bidir",
        ],
    );
    server_done(s);
    assert_eq!(r["verified"], true, "{r}");
    assert!(
        r["reverse_gbit_per_s"].as_f64().unwrap() > 0.0,
        "the server wrote back: {r}"
    );
}

#[test]
fn a_timed_run_stops_posting_after_its_duration_and_reports_what_completed() {
    let (cip, sip, oob) = ("127.0.156.11", "127.0.156.12", 18756);
    let s = server(sip, oob, &[]);
    let started = Instant::now();
    // A count the link cannot reach in 0.5 s: the duration ends the run.
    let r = client(
        cip,
        sip,
        oob,
        &[
            "--op",
            "write",
            "--size",
            "4096",
            "--qd",
            "16",
            "--iters",
            "100000000",
            "--duration",
            "0.5",
        ],
    );
    server_done(s);
    let iters = r["iters"].as_u64().unwrap();
    let secs = r["seconds"].as_f64().unwrap();
    assert!(iters > 0 && iters < 100_000_000, "{r}");
    assert!((0.5..10.0).contains(&secs), "ran {secs} s: {r}");
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert_eq!(r["verified"], true, "{r}");
    let rate = r["msg_per_s"].as_f64().unwrap();
    let expect = iters as f64 / secs;
    assert!((rate - expect).abs() <= expect * 1e-6, "{r}");
}

#[test]
fn bad_durations_are_refused() {
    for d in ["0", "-1", "nan", "1e9"] {
        let out = rperf()
            .args([
                "client",
                "--bind",
                "127.0.156.13:4791",
                "--server",
                "127.0.156.14:18757",
                &format!("--duration={d}"),
            ])
            .output()
            .unwrap();
        assert!(!out.status.success(), "--duration {d} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--duration"), "--duration {d}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// The number that follows `key` in `line`.
fn number_after(line: &str, key: &str) -> f64 {
    let at = line
        .find(key)
        .unwrap_or_else(|| panic!("no {key:?} in {line}"));
    line[at + key.len()..]
        .split([' ', ',', ';'])
        .find(|w| !w.is_empty())
        .unwrap()
        .parse()
        .unwrap_or_else(|e| panic!("{line}: {key}: {e}"))
}

#[test]
fn baseline_runs_plain_udp_and_prints_the_ratio() {
    let (cip, sip, oob) = ("127.0.156.15", "127.0.156.16", 18758);
    let s = server(sip, oob, &[]);
    let out = rperf()
        .args([
            "client",
            "--bind",
            &format!("{cip}:4791"),
            "--server",
            &format!("{sip}:{oob}"),
            "--op",
            "write",
            "--size",
            "65536",
            "--qd",
            "16",
            "--iters",
            "512",
            "--baseline",
        ])
        .output()
        .expect("run rperf client");
    server_done(s);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.contains("baseline plain UDP"))
        .unwrap_or_else(|| panic!("no baseline line in {text}"));
    // " baseline plain UDP: G Gb/s, D datagrams/s; ours/baseline = R"
    let num = |key: &str| number_after(line, key);
    let base_gbps = num("baseline plain UDP:");
    let ratio = num("ours/baseline =");
    assert!(base_gbps > 0.0, "the baseline moved data: {line}");
    // Our goodput from the table row, divided by the baseline, is the ratio.
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("write"))
        .unwrap();
    let ours: f64 = row.split_whitespace().nth(4).unwrap().parse().unwrap();
    assert!(
        (ours / base_gbps - ratio).abs() <= 0.02 + ratio * 0.01,
        "{row} / {line}"
    );
    // " CPU ns/byte: client C server S; baseline client BC server BS;
    //   baseline/ours client RC server RS": every cost measured and
    // positive (32 MiB moved: the sampled turns cannot all miss), and
    // each ratio is the quotient of the numbers printed.
    let cpu = text
        .lines()
        .find(|l| l.contains("CPU ns/byte"))
        .unwrap_or_else(|| panic!("no CPU line in {text}"));
    let words: Vec<&str> = cpu.split([' ', ';']).filter(|w| !w.is_empty()).collect();
    let after = |from: usize, key: &str| -> f64 {
        let i = from + words[from..].iter().position(|w| *w == key).unwrap();
        words[i + 1]
            .parse()
            .unwrap_or_else(|e| panic!("{cpu}: {key}: {e}"))
    };
    let base_at = words.iter().position(|w| *w == "baseline").unwrap();
    let ratio_at = words.iter().position(|w| *w == "baseline/ours").unwrap();
    let (c, s_) = (after(0, "client"), after(0, "server"));
    let (bc, bs) = (after(base_at, "client"), after(base_at, "server"));
    let (rc, rs) = (after(ratio_at, "client"), after(ratio_at, "server"));
    for v in [c, s_, bc, bs] {
        assert!(v > 0.0 && v.is_finite(), "{cpu}");
    }
    assert!((bc / c - rc).abs() <= 0.011 + rc * 0.01, "{cpu}");
    assert!((bs / s_ - rs).abs() <= 0.011 + rs * 0.01, "{cpu}");
    let floor_at = words.iter().position(|w| *w == "floor").unwrap();
    for v in [after(floor_at, "client"), after(floor_at, "server")] {
        assert!(v > 0.0 && v.is_finite(), "{cpu}");
    }
    // " floor (...): F Gb/s; ours/floor = R; floor/baseline = Q": the sink
    // counted only datagrams whose CRC held, so F > 0 means the CRCs the
    // sender computed arrived intact and checked.
    let floor = text
        .lines()
        .find(|l| l.starts_with(" floor"))
        .unwrap_or_else(|| panic!("no floor line in {text}"));
    let fnum = |key: &str| number_after(floor, key);
    let floor_gbps = fnum("place):");
    assert!(floor_gbps > 0.0, "{floor}");
    let (of, fb) = (fnum("ours/floor ="), fnum("floor/baseline ="));
    assert!(
        (ours / floor_gbps - of).abs() <= 0.02 + of * 0.01,
        "{floor}"
    );
    assert!(
        (floor_gbps / base_gbps - fb).abs() <= 0.02 + fb * 0.01,
        "{floor}"
    );
    // A WRITE of 64 KiB also gets the floor in its packet shape, whose
    // sink checked every CRC as the plain floor's did.
    let shaped = text
        .lines()
        .find(|l| l.starts_with(" floor in a WRITE's packet shape"))
        .unwrap_or_else(|| panic!("no shaped floor line in {text}"));
    let shaped_gbps = number_after(shaped, "message):");
    assert!(shaped_gbps > 0.0, "{shaped}");
    let os = number_after(shaped, "ours/shaped floor =");
    assert!(
        (ours / shaped_gbps - os).abs() <= 0.02 + os * 0.01,
        "{shaped}"
    );
    eprintln!(
        "measured: {row}\n          {line}\n          {floor}\n          {shaped}\n          {cpu}"
    );
}
