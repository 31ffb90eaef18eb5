//! `rperftest` client against `rperftest` server, two processes over the
//! soft RoCE NIC on 127.0.130.1 (server) and 127.0.130.2 (client), for
//! WRITE, READ and SEND, with the data checked exactly (the two know each
//! other from the version field's tag); atomics (FETCH_AND_ADD and
//! CMP_AND_SWAP, bandwidth and latency, on 127.0.161.1 and .2) with every
//! returned value and every final slot value checked, also over a lossy
//! link; and peers that break perftest's exchange (an old version, a
//! garbage dest message, a peer that leaves), which must end in a clear
//! error and no panic. Module `rdma_cm`: the same over perftest's RDMA CM
//! mode (`-R`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const SERVER: &str = "127.0.130.1";
const CLIENT: &str = "127.0.130.2";

fn rperftest() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rperftest"));
    c.env("NICD_MODE", "own");
    c
}

/// Starts a server and waits until it listens (its banner is printed once
/// the socket is bound).
fn server(args: &[&str]) -> (Child, std::io::Lines<BufReader<std::process::ChildStdout>>) {
    let mut child = rperftest()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let l = lines
            .next()
            .expect("server ended before listening")
            .unwrap();
        if l.contains("Waiting for client") {
            break;
        }
        assert!(Instant::now() < deadline, "server never listened");
    }
    (child, lines)
}

/// Waits for a child with a deadline; returns its output.
fn finish(mut child: Child, secs: u64) -> Output {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("process did not end in {secs} s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// One op both ways: the client's result line names size and iterations,
/// both sides say what they verified.
fn both_ours(verb: &str, tcp: &str, udp: &str, size: &str, iters: &str, expect: &[&str]) {
    let common = ["-p", tcp, "--udp-port", udp, "-s", size, "-n", iters];
    let mut sargs = vec![verb, "--bind", SERVER, "--timeout", "20"];
    sargs.extend(common);
    let (srv, lines) = server(&sargs);
    let mut cargs = vec![verb, SERVER, "--bind", CLIENT, "--timeout", "20", "-x", "0"];
    cargs.extend(common);
    cargs.extend(["-d", "softroce0", "-F", "--report_gbits", "-m", "2048"]);
    let client = rperftest().args(&cargs).output().unwrap();
    let out = text(&client.stdout);
    assert!(client.status.success(), "{out}{}", text(&client.stderr));
    assert!(out.contains("BW average[Gb/sec]"), "{out}");
    let result = out
        .lines()
        .find(|l| l.split_whitespace().take(2).eq([size, iters]))
        .unwrap_or_else(|| panic!("no result line for {size} x {iters}: {out}"));
    let avg: f64 = result.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert!(avg > 0.0, "{result}");
    assert!(out.contains("peer 6.06 (rperftest)"), "{out}");
    // The server's port MTU (default 1024) is smaller than ours: it wins.
    assert!(out.contains("MTU 1024"), "{out}");
    assert!(
        out.contains(&format!("verified: {iters} completions")),
        "{out}"
    );
    let status = finish(srv, 30);
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let all = rest.join("\n");
    assert!(status.status.success(), "{all}{}", text(&status.stderr));
    assert!(
        rest.iter()
            .any(|l| l.split_whitespace().take(2).eq([size, iters])),
        "server printed no result: {all}"
    );
    for e in expect {
        assert!(
            out.contains(e) || all.contains(e),
            "missing {e:?}:\n{out}\n{all}"
        );
    }
}

#[test]
fn write_lands_the_clients_pattern_slot_by_slot() {
    // 100 bytes step by 128 through the 4 KiB cycle buffer: 32 slots,
    // wrapping 15 times.
    both_ours(
        "write",
        "18531",
        "24831",
        "100",
        "500",
        &["all 32 written slots hold the client's pattern; nothing else changed"],
    );
}

#[test]
fn read_brings_back_the_servers_pattern() {
    both_ours(
        "read",
        "18532",
        "24832",
        "1000",
        "300",
        &[
            "every READ brought back the server's pattern (300 x 1000 bytes)",
            "the READ source buffer was not written",
        ],
    );
}

#[test]
fn send_carries_the_clients_pattern() {
    // Larger than half the cycle buffer: every SEND from the same source,
    // several packets each.
    both_ours(
        "send",
        "18533",
        "24833",
        "5000",
        "300",
        &[
            "300 receives, all successful with 5000 bytes each",
            "every SEND carried the client's pattern",
        ],
    );
}

/// A client that ran its part (its result line starts with `first`, the
/// message size and count) against a server that then refused at its
/// check saying `says` and closed, so the client's closing swap failed.
fn refused_after_the_run(client: &Output, srv: Child, first: [&str; 2], secs: u64, says: &str) {
    let cerr = no_panic(client);
    let out = text(&client.stdout);
    assert!(
        out.lines().any(|l| l.split_whitespace().take(2).eq(first)),
        "{out}"
    );
    assert!(cerr.contains("swapping QP addresses"), "{cerr}");
    let o = finish(srv, secs);
    let err = no_panic(&o);
    assert!(err.contains(says), "{err}");
}

fn no_panic(o: &Output) -> String {
    let err = text(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(!o.status.success());
    err
}

#[test]
fn an_old_version_is_refused_with_the_reason() {
    let (srv, _lines) = server(&[
        "write",
        "--bind",
        SERVER,
        "-p",
        "18534",
        "--udp-port",
        "24834",
        "--timeout",
        "10",
    ]);
    let mut s = TcpStream::connect((SERVER, 18534)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut v = [0u8; 16];
    v[..4].copy_from_slice(b"5.60");
    s.write_all(&v).unwrap();
    // The server answers with its own version before it judges ours.
    let mut theirs = [0u8; 16];
    s.read_exact(&mut theirs).unwrap();
    assert_eq!(&theirs[..5], b"6.06\0");
    let o = finish(srv, 20);
    let err = no_panic(&o);
    assert!(
        err.contains("\"5.60\" is not a perftest version >= 5.70"),
        "{err}"
    );
}

/// A fake perftest server that follows the exchange up to the first dest
/// message, then sends `dest` instead.
fn fake_server(port: u16, dest: Vec<u8>) -> std::thread::JoinHandle<()> {
    let l = TcpListener::bind((SERVER, port)).unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut swap = |len: usize, mine: &[u8]| {
            let mut b = vec![0u8; len];
            s.read_exact(&mut b).unwrap();
            s.write_all(mine).unwrap();
        };
        let mut v = [0u8; 16];
        v[..4].copy_from_slice(b"6.06");
        swap(16, &v);
        swap(4, &4096u32.to_be_bytes());
        swap(4, &64u32.to_be_bytes());
        swap(2, b"3\0");
        if !dest.is_empty() {
            swap(108, &dest);
        }
        // Leave: the client must notice the closed socket.
    })
}

/// Our client against `fake`, a fake server on `port`; returns its stderr.
fn client_against_fake(verb: &str, port: u16, fake: std::thread::JoinHandle<()>) -> String {
    let (tcp, udp) = (port.to_string(), (port + 6300).to_string());
    let o = rperftest()
        .args([verb, SERVER, "--bind", CLIENT, "-p", &tcp])
        .args(["--udp-port", &udp, "--timeout", "10"])
        .output()
        .unwrap();
    fake.join().unwrap();
    no_panic(&o)
}

#[test]
fn a_garbage_dest_message_is_refused_with_the_reason() {
    let mut junk = vec![0u8; 108];
    junk[..20].copy_from_slice(b"this is not a dest!!");
    let err = client_against_fake("write", 18535, fake_server(18535, junk));
    assert!(
        err.contains("is not LID:OUT_READS:QPN:PSN:RKEY:VADDR"),
        "{err}"
    );
}

#[test]
fn a_peer_that_leaves_mid_exchange_is_named() {
    let err = client_against_fake("read", 18536, fake_server(18536, Vec::new()));
    assert!(
        err.contains("peer closed the connection while swapping QP addresses"),
        "{err}"
    );
}

#[test]
fn bad_options_are_refused_before_anything_starts() {
    let o = rperftest()
        .args(["send", "--bind", SERVER, "-d", "rxe0", "-p", "18537"])
        .output()
        .unwrap();
    // -d names an rdma-core device: whatever this host has, one line
    // that says what is missing, before any peer is waited for.
    let err = no_panic(&o);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("apt-get install libibverbs1")
            || err.contains("no RDMA device named rxe0")
            || err.contains("no RDMA in this kernel"),
        "{err}"
    );
    // Our soft RoCE NIC needs its address.
    let o = rperftest().args(["send", "-p", "18537"]).output().unwrap();
    assert!(no_panic(&o).contains("give --bind"));
    let o = rperftest()
        .args(["send", "--bind", SERVER, "-m", "1500", "-p", "18537"])
        .output()
        .unwrap();
    assert!(no_panic(&o).contains("MTU must be"));
}

#[test]
fn a_lossy_link_still_delivers_every_byte() {
    // 3 % of the client's packets dropped (SOFTROCE_FAULTS, read by the
    // soft RoCE provider): go-back-N retransmission must still land every
    // slot with the client's pattern.
    let common = [
        "-p",
        "18538",
        "--udp-port",
        "24838",
        "-s",
        "3000",
        "-n",
        "200",
        "--timeout",
        "20",
    ];
    let mut sargs = vec!["write", "--bind", SERVER];
    sargs.extend(common);
    let (srv, lines) = server(&sargs);
    let mut cargs = vec!["write", SERVER, "--bind", CLIENT];
    cargs.extend(common);
    let client = rperftest()
        .args(&cargs)
        .env("SOFTROCE_FAULTS", "loss=0.03,seed=7")
        .output()
        .unwrap();
    let out = text(&client.stdout);
    assert!(client.status.success(), "{out}{}", text(&client.stderr));
    assert!(out.contains("verified: 200 completions"), "{out}");
    let retransmitted: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix(" NIC: "))
        .and_then(|l| l.split(", ").nth(1))
        .and_then(|f| f.strip_suffix(" retransmitted"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no NIC counters: {out}"));
    assert!(retransmitted > 0, "the loss never bit: {out}");
    let status = finish(srv, 30);
    let all: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(status.status.success(), "{all:?}");
    assert!(
        all.iter().any(|l| l.contains(
            "verified: all 1 written slots hold the client's pattern; nothing else changed"
        )),
        "{all:?}"
    );
}

#[test]
fn a_server_without_a_client_gives_up_after_the_timeout() {
    let o = rperftest()
        .args([
            "read",
            "--bind",
            SERVER,
            "-p",
            "18539",
            "--udp-port",
            "24839",
            "--timeout",
            "1",
        ])
        .output()
        .unwrap();
    assert!(no_panic(&o).contains("no client connected within 1s"));
}

#[test]
fn a_server_told_another_size_says_so() {
    // perftest wants the same -s on both sides; the client's report names
    // its size, and our WRITE server refuses to check against another.
    let (srv, _lines) = server(&[
        "write",
        "--bind",
        SERVER,
        "-p",
        "18540",
        "--udp-port",
        "24840",
        "-s",
        "100",
        "-n",
        "50",
        "--timeout",
        "10",
    ]);
    let client = rperftest()
        .args([
            "write",
            SERVER,
            "--bind",
            CLIENT,
            "-p",
            "18540",
            "--udp-port",
            "24840",
            "-s",
            "200",
            "-n",
            "50",
            "--timeout",
            "10",
        ])
        .output()
        .unwrap();
    // The client ran its part; the server gives up at the check and
    // closes, so the client's closing swap fails (reset or closed).
    refused_after_the_run(
        &client,
        srv,
        ["200", "50"],
        20,
        "the client moved 200-byte messages, we were told -s 100",
    );
}

#[test]
fn a_duration_run_reports_what_completed_and_the_server_checks_that() {
    let (srv_ip, cli_ip, tcp, udp) = ("127.0.156.22", "127.0.156.23", "18759", "24859");
    let (srv, lines) = server(&[
        "write",
        "--bind",
        srv_ip,
        "-p",
        tcp,
        "--udp-port",
        udp,
        "-s",
        "100",
        "--timeout",
        "20",
    ]);
    let started = Instant::now();
    let client = rperftest()
        .args([
            "write",
            srv_ip,
            "--bind",
            cli_ip,
            "-p",
            tcp,
            "--udp-port",
            udp,
        ])
        .args(["-s", "100", "-D", "1", "--timeout", "20"])
        .output()
        .unwrap();
    let out = text(&client.stdout);
    assert!(client.status.success(), "{out}{}", text(&client.stderr));
    assert!(started.elapsed() >= Duration::from_secs(1));
    let result = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some("100"))
        .unwrap_or_else(|| panic!("no result line: {out}"));
    let iters: u64 = result.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(iters > 0 && iters < 1 << 32, "{result}");
    assert!(
        out.contains(&format!("verified: {iters} completions")),
        "{out}"
    );
    let status = finish(srv, 30);
    let all: Vec<String> = lines.map_while(Result::ok).collect();
    let all = all.join("\n");
    assert!(status.status.success(), "{all}{}", text(&status.stderr));
    assert!(
        all.contains(&format!(
            "the client moved {iters} messages, we were told -n 5000"
        )),
        "{all}"
    );
    let slots = iters.min(32);
    assert!(
        all.contains(&format!(
            "all {slots} written slots hold the client's pattern; nothing else changed"
        )),
        "{all}"
    );
}

#[test]
fn duration_is_refused_for_send_and_when_zero() {
    for (verb, d, says) in [
        ("send", "1", "-D works with write and read"),
        ("write", "0", "duration"),
    ] {
        let out = rperftest()
            .args([
                verb,
                "127.0.156.22",
                "--bind",
                "127.0.156.23",
                "-p",
                "18760",
                "-D",
                d,
            ])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = text(&out.stderr);
        assert!(err.contains(says), "{verb} -D {d}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

const ATOMIC_SERVER: &str = "127.0.161.1";
const ATOMIC_CLIENT: &str = "127.0.161.2";

/// Both sides' output of an atomic run.
struct AtomicRun {
    client: String,
    server: String,
}

/// `rperftest atomic` both ways with `args` (op, mode, count) on both
/// sides, `env` (SOFTROCE_FAULTS) on client and server; both must succeed
/// and print perftest's result line for 8 bytes x `iters`.
fn atomic_both_ours(
    tcp: &str,
    udp: &str,
    args: &[&str],
    iters: &str,
    faults: [Option<&str>; 2],
) -> AtomicRun {
    let common = ["-p", tcp, "--udp-port", udp, "-n", iters, "--timeout", "30"];
    let mut srv_cmd = rperftest();
    srv_cmd.args(["atomic", "--bind", ATOMIC_SERVER]);
    srv_cmd.args(common).args(args);
    if let Some(f) = faults[1] {
        srv_cmd.env("SOFTROCE_FAULTS", f);
    }
    let mut srv = srv_cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(srv.stdout.take().unwrap()).lines();
    let mut server = String::new();
    for l in lines.by_ref() {
        let l = l.unwrap();
        server += &l;
        server.push('\n');
        if l.contains("Waiting for client") {
            break;
        }
    }
    assert!(server.contains("Waiting for client"), "server: {server}");
    let mut cli = rperftest();
    cli.args(["atomic", ATOMIC_SERVER, "--bind", ATOMIC_CLIENT]);
    cli.args(common).args(args).args(["-s", "8"]);
    if let Some(f) = faults[0] {
        cli.env("SOFTROCE_FAULTS", f);
    }
    let c = cli.output().unwrap();
    let client = text(&c.stdout);
    let status = finish(srv, 60);
    for l in lines.map_while(Result::ok) {
        server += &l;
        server.push('\n');
    }
    assert!(c.status.success(), "client: {client}{}", text(&c.stderr));
    assert!(
        status.status.success(),
        "server: {server}{}",
        text(&status.stderr)
    );
    assert!(client.contains("peer 6.06 (rperftest)"), "{client}");
    assert!(
        client.contains(&format!("verified: {iters} completions, all successful")),
        "{client}"
    );
    let result = client
        .lines()
        .find(|l| l.split_whitespace().take(2).eq(["8", iters]))
        .unwrap_or_else(|| panic!("no result line for 8 x {iters}: {client}"));
    let numbers: Vec<f64> = result
        .split_whitespace()
        .map(|f| f.parse().unwrap())
        .collect();
    // Bandwidth: peak, average (MB/s, two decimals: 0.00 for a slow
    // lossy run of 8-byte messages) and the message rate (six decimals);
    // latency: min to 99.9 %.
    assert!(numbers[2..].iter().all(|&x| x >= 0.0), "{result}");
    assert!(numbers.last().is_some_and(|&x| x > 0.0), "{result}");
    AtomicRun { client, server }
}

fn says(out: &str, what: &str) {
    assert!(out.contains(what), "missing {what:?} in:\n{out}");
}

#[test]
fn atomic_fetch_add_bw_returns_distinct_counts_and_leaves_the_sums() {
    // 500 over perftest's 64-slot walk, 16 in flight (our responder depth).
    let r = atomic_both_ours("18761", "24861", &["-A", "FETCH_AND_ADD"], "500", [None; 2]);
    says(&r.client, "Atomic FETCH_AND_ADD BW Test");
    says(&r.client, "BW average[MB/sec]");
    says(
        &r.client,
        "every FETCH_AND_ADD returned its slot's initial value plus 1 per earlier one \
         (500 in 64 slots, all returned values of a slot distinct)",
    );
    says(
        &r.server,
        "all 64 atomic slots hold their initial value plus 1 per FETCH_AND_ADD (500 in all); nothing else changed",
    );
}

#[test]
fn atomic_cmp_swap_bw_swaps_when_the_compare_matches() {
    // Slots 0..52 visited 8 times, 52..64 7 times; every fourth visit's
    // compare misses: 6 swaps per slot.
    let r = atomic_both_ours("18762", "24862", &["-A", "CMP_AND_SWAP"], "500", [None; 2]);
    says(&r.client, "Atomic CMP_AND_SWAP BW Test");
    says(
        &r.client,
        "every CMP_AND_SWAP returned its slot's value after the earlier swaps \
         (500 in 64 slots, 384 compares matched and swapped",
    );
    says(
        &r.server,
        "all 64 atomic slots hold the last swap whose compare matched (500 CMP_AND_SWAP in all)",
    );
}

#[test]
fn atomic_latency_runs_one_at_a_time_on_one_slot() {
    let r = atomic_both_ours("18763", "24863", &["--lat"], "200", [None; 2]);
    says(&r.client, "Atomic FETCH_AND_ADD Latency Test");
    says(&r.client, "TX depth       : 1");
    says(&r.client, "t_typical[usec]");
    says(
        &r.client,
        "every FETCH_AND_ADD returned its slot's initial value plus 1 per earlier one (200 in 1 slot,",
    );
    says(
        &r.server,
        "the atomic slot holds its initial value plus 1 per FETCH_AND_ADD (200 in all); nothing else changed",
    );
    let r = atomic_both_ours(
        "18764",
        "24864",
        &["--lat", "-A", "CMP_AND_SWAP"],
        "200",
        [None; 2],
    );
    says(&r.client, "Atomic CMP_AND_SWAP Latency Test");
    says(
        &r.client,
        "(200 in 1 slot, 150 compares matched and swapped",
    );
    says(
        &r.server,
        "the atomic slot holds the last swap whose compare matched (200 CMP_AND_SWAP in all)",
    );
}

#[test]
fn atomics_over_a_lossy_link_execute_once() {
    // The server loses 5 % of its atomic ACKs and the client duplicates
    // 5 % of its requests: the responder must answer a repeated atomic
    // from its responder resources, not execute it again (IBA 9.4.5,
    // 9.7.5.2.3), or a FETCH_AND_ADD would return or leave one too many.
    let r = atomic_both_ours(
        "18765",
        "24865",
        &["-A", "FETCH_AND_ADD"],
        "400",
        [Some("loss=0.03,dup=0.05,seed=5"), Some("loss=0.05,seed=6")],
    );
    says(
        &r.client,
        "(400 in 64 slots, all returned values of a slot distinct)",
    );
    says(
        &r.server,
        "plus 1 per FETCH_AND_ADD (400 in all); nothing else changed",
    );
    let duplicates = |out: &str| -> u64 {
        out.lines()
            .find_map(|l| l.strip_prefix(" NIC: "))
            .and_then(|l| l.split(", ").nth(4))
            .and_then(|f| f.strip_suffix(" duplicate requests"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no NIC counters: {out}"))
    };
    assert!(
        duplicates(&r.server) > 0,
        "no duplicate reached the responder: {}",
        r.server
    );
}

#[test]
fn atomic_sides_told_different_ops_say_so() {
    let (srv, _lines) = server(&[
        "atomic",
        "--bind",
        ATOMIC_SERVER,
        "-p",
        "18766",
        "--udp-port",
        "24866",
        "-A",
        "CMP_AND_SWAP",
        "-n",
        "100",
        "--timeout",
        "20",
    ]);
    let client = rperftest()
        .args(["atomic", ATOMIC_SERVER, "--bind", ATOMIC_CLIENT])
        .args(["-p", "18766", "--udp-port", "24866", "-n", "100"])
        .args(["-A", "FETCH_AND_ADD", "--timeout", "20"])
        .output()
        .unwrap();
    refused_after_the_run(
        &client,
        srv,
        ["8", "100"],
        30,
        "the slots hold what 100 FETCH_AND_ADD would leave, not 100 CMP_AND_SWAP: run both sides with the same -A",
    );
}

#[test]
fn atomic_options_are_refused_like_perftest() {
    for (args, says) in [
        (&["atomic", "-s", "16"][..], "atomics move 8 bytes; -s 16"),
        (&["write", "--lat"][..], "--lat works with atomic only"),
        (&["atomic", "--lat", "-n", "4"][..], "at least 5 iterations"),
        (
            &["atomic", "--lat", "-D", "1"][..],
            "-D works with bandwidth tests",
        ),
        (&["atomic", "-A", "SWAP"][..], "invalid value 'SWAP'"),
    ] {
        let o = rperftest()
            .args(args)
            .args(["--bind", ATOMIC_SERVER, "-p", "18767", "--timeout", "1"])
            .output()
            .unwrap();
        let err = no_panic(&o);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn an_atomic_stream_outlives_the_retransmission_timer() {
    // Atomics only, for 2 s on a perfect link: many times the requester's
    // retransmission timeout (timeout 14: 67 ms) times its retry count (7).
    // Each atomic ACK is progress that restarts the timer and restores the
    // retries; without that the stream ends in "transport retry counter
    // exceeded" after about half a second. The server checks the count the
    // client reports.
    let (srv, lines) = server(&[
        "atomic",
        "--bind",
        ATOMIC_SERVER,
        "-p",
        "18768",
        "--udp-port",
        "24868",
        "--timeout",
        "20",
    ]);
    let client = rperftest()
        .args(["atomic", ATOMIC_SERVER, "--bind", ATOMIC_CLIENT])
        .args([
            "-p",
            "18768",
            "--udp-port",
            "24868",
            "-D",
            "2",
            "--timeout",
            "20",
        ])
        .output()
        .unwrap();
    let out = text(&client.stdout);
    assert!(client.status.success(), "{out}{}", text(&client.stderr));
    let iters: u64 = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some("8"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no result line: {out}"));
    let status = finish(srv, 30);
    let all: Vec<String> = lines.map_while(Result::ok).collect();
    let all = all.join("\n");
    assert!(status.status.success(), "{all}{}", text(&status.stderr));
    says(
        &all,
        &format!("plus 1 per FETCH_AND_ADD ({iters} in all); nothing else changed"),
    );
}

/// perftest's RDMA CM mode (`-R`): `rperftest -R` client against
/// `rperftest -R` server on 127.95.x.y, over our soft iWARP NIC and our
/// soft RoCE NIC, WRITE and READ (and SEND over iWARP), the data checked
/// exactly and both sides' bandwidth lines read back; then peers that
/// break the exchange on its RDMA CM connection (a message of the wrong
/// size, a peer that disconnects halfway), built here from the same NIC,
/// CM and verbs: each ends in a clear error within the timeout, never a
/// hang or a panic.
mod rdma_cm {
    use super::*;
    use rdma_perf::device::{Nic, NicChoice};
    use rdma_types::{AccessFlags, Gid, Mtu, Psn, WcStatus};
    use std::net::SocketAddr;
    use std::sync::Arc;
    use verbs::{MemBuf, RecvWr, SendOpcode, SendWr, Sge, WorkCompletion};

    /// The result line for `size` x `iters` in `out`, its average above 0.
    fn bw_line(out: &str, size: &str, iters: &str) -> f64 {
        let line = out
            .lines()
            .find(|l| l.split_whitespace().take(2).eq([size, iters]))
            .unwrap_or_else(|| panic!("no result line for {size} x {iters}:\n{out}"));
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.len(), 5, "{line}");
        let avg: f64 = f[3].parse().unwrap();
        let rate: f64 = f[4].parse().unwrap();
        assert!(avg > 0.0 && rate > 0.0, "{line}");
        avg
    }

    /// One test both ways with -R; `nic` is `--iwarp` or the soft RoCE
    /// NIC's UDP port.
    fn both_ours(verb: &str, nic: &[&str], srv: &str, cli: &str, port: &str, expect: &[&str]) {
        let (size, iters) = ("4096", "300");
        let common = ["-R", "-p", port, "-s", size, "-n", iters, "--timeout", "20"];
        let mut sargs = vec![verb, "--bind", srv];
        sargs.extend(nic);
        sargs.extend(common);
        let (s, lines) = server(&sargs);
        let mut cargs = vec![verb, srv, "--bind", cli];
        cargs.extend(nic);
        cargs.extend(common);
        let client = rperftest().args(&cargs).output().unwrap();
        let out = text(&client.stdout);
        assert!(client.status.success(), "{out}{}", text(&client.stderr));
        let mine = bw_line(&out, size, iters);
        assert!(out.contains("peer 6.06 (rperftest)"), "{out}");
        assert!(
            out.contains(&format!("verified: {iters} completions")),
            "{out}"
        );
        let o = finish(s, 30);
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        let all = rest.join("\n");
        assert!(o.status.success(), "{all}{}", text(&o.stderr));
        let theirs = bw_line(&all, size, iters);
        if verb != "send" {
            // A WRITE/READ server prints the client's report as it came.
            assert_eq!(mine, theirs, "{out}\n{all}");
        }
        for e in expect {
            assert!(
                out.contains(e) || all.contains(e),
                "missing {e:?}:\n{out}\n{all}"
            );
        }
    }

    #[test]
    fn write_over_iwarp_with_rdma_cm_lands_the_clients_pattern() {
        both_ours(
            "write",
            &["--iwarp"],
            "127.95.0.1",
            "127.95.0.2",
            "18601",
            &["written slots hold the client's pattern; nothing else changed"],
        );
    }

    #[test]
    fn read_over_iwarp_with_rdma_cm_brings_back_the_servers_pattern() {
        both_ours(
            "read",
            &["--iwarp"],
            "127.95.0.3",
            "127.95.0.4",
            "18602",
            &[
                "every READ brought back the server's pattern (300 x 4096 bytes)",
                "the READ source buffer was not written",
            ],
        );
    }

    #[test]
    fn send_over_iwarp_with_rdma_cm_carries_the_clients_pattern() {
        both_ours(
            "send",
            &["--iwarp"],
            "127.95.0.5",
            "127.95.0.6",
            "18603",
            &["every SEND carried the client's pattern"],
        );
    }

    #[test]
    fn write_and_read_over_soft_roce_with_rdma_cm() {
        both_ours(
            "write",
            &["--udp-port", "24901"],
            "127.95.0.7",
            "127.95.0.8",
            "18604",
            &["written slots hold the client's pattern; nothing else changed"],
        );
        both_ours(
            "read",
            &["--udp-port", "24902"],
            "127.95.0.9",
            "127.95.0.10",
            "18605",
            &["every READ brought back the server's pattern (300 x 4096 bytes)"],
        );
    }

    #[test]
    fn atomics_and_latency_are_refused_with_rdma_cm() {
        let o = rperftest()
            .args(["atomic", "--iwarp", "--bind", "127.95.0.11", "-R"])
            .output()
            .unwrap();
        assert!(!o.status.success());
        let err = text(&o.stderr);
        assert!(
            err.contains("-R (RDMA CM) works with write, read and send"),
            "{err}"
        );
    }

    #[test]
    fn a_client_without_a_server_says_so_within_its_timeout() {
        let t = Instant::now();
        let o = rperftest()
            .args(["write", "127.95.0.13", "--iwarp", "--bind", "127.95.0.14"])
            .args(["-R", "-p", "18606", "--timeout", "5"])
            .output()
            .unwrap();
        assert!(t.elapsed() < Duration::from_secs(20));
        assert!(!o.status.success());
        let err = text(&o.stderr);
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            err.contains("RDMA CM connect for the exchange to 127.95.0.13:18606"),
            "{err}"
        );
        assert!(err.contains("is the server running with -R"), "{err}");
    }

    /// A misbehaving peer: our iWARP NIC at `ip`, one RC QP on an RDMA CM
    /// connection, SENDs and receives by hand.
    struct Fake {
        nic: Nic,
        cm: Arc<dyn rdma_access::rdmacm::Service>,
        p: Arc<dyn verbs::Provider>,
        cq: verbs::CqHandle,
        qp: verbs::QpHandle,
        qpn: rdma_types::Qpn,
        mem: MemBuf,
        mr: verbs::MrInfo,
        conn: Option<rdma_access::ConnId>,
    }

    impl Fake {
        fn open(ip: &str) -> Fake {
            let nic = Nic::open(&NicChoice::Iwarp {
                ip: ip.parse().unwrap(),
                opts: iwarp_tcp::NicOptions::default(),
            })
            .unwrap();
            let (cm, _) = nic.rdma_cm(7 << 8).unwrap();
            let p = nic.provider().clone();
            let rdma_perf::device::RcQp {
                cq, qp, mem, mr, ..
            } = nic
                .rc_qp(16, 4, 4, 256, AccessFlags::LOCAL_WRITE)
                .unwrap_or_else(|(what, e)| panic!("{what}: {e}"));
            nic.init_qp(qp, AccessFlags::LOCAL_WRITE).unwrap();
            let qpn = p.qp_num(qp).unwrap();
            let f = Fake {
                nic,
                cm,
                p,
                cq,
                qp,
                qpn,
                mem,
                mr,
                conn: None,
            };
            f.post_recv();
            f
        }

        fn post_recv(&self) {
            self.p
                .post_recv(
                    self.qp,
                    &[RecvWr {
                        wr_id: 1,
                        sges: verbs::sges![Sge {
                            addr: self.mem.addr(),
                            length: 128,
                            lkey: self.mr.lkey,
                        }],
                    }],
                )
                .unwrap();
        }

        fn rts(&self, peer: Gid, remote_qpn: rdma_types::Qpn, remote_psn: Psn) {
            self.nic
                .cm_rtr_rts(
                    self.qp,
                    peer,
                    remote_qpn,
                    remote_psn,
                    Psn::new(1),
                    Mtu::Mtu1024,
                    1,
                )
                .unwrap();
        }

        /// Connects to `server` (listening already).
        fn connect(&mut self, from: &str, server: &str, port: u16) {
            let dst = SocketAddr::new(server.parse().unwrap(), port);
            let est = self
                .cm
                .connect(
                    from.parse().unwrap(),
                    dst,
                    self.qpn,
                    Psn::new(1),
                    &[],
                    Duration::from_secs(10),
                )
                .unwrap_or_else(|e| panic!("connect to {dst}: {e}"));
            self.rts(Gid::from_ip(dst.ip()), est.remote_qpn, est.remote_psn);
            self.conn = Some(est.conn);
        }

        /// Accepts the first request `rx` (our listener) brings.
        fn accept(&mut self, rx: &std::sync::mpsc::Receiver<rdma_access::rdmacm::Listened>) {
            let req = rx.recv_timeout(Duration::from_secs(20)).unwrap().unwrap();
            self.rts(req.peer, req.remote_qpn, req.remote_psn);
            self.conn = Some(req.conn);
            assert!(req.accept(self.qpn, Psn::new(1), Vec::new()));
        }

        fn next(&self) -> WorkCompletion {
            let mut wc = [WorkCompletion::new(
                0,
                WcStatus::Success,
                rdma_types::WcOpcode::Send,
                0,
            )];
            let end = Instant::now() + Duration::from_secs(20);
            loop {
                if self.p.poll_cq(self.cq, &mut wc).unwrap() == 1 {
                    assert_eq!(wc[0].status, WcStatus::Success);
                    return wc[0];
                }
                assert!(Instant::now() < end, "no completion");
                let _ = self.p.req_notify_cq(self.cq, false);
                let _ = self.p.wait_cq(self.cq, Duration::from_millis(20));
            }
        }

        fn send(&self, m: &[u8]) {
            self.mem.write_at(128, m);
            self.p
                .post_send(
                    self.qp,
                    &[SendWr::new(
                        2,
                        SendOpcode::Send,
                        vec![Sge {
                            addr: self.mem.addr() + 128,
                            length: m.len() as u32,
                            lkey: self.mr.lkey,
                        }],
                    )],
                )
                .unwrap();
            assert_eq!(self.next().wr_id, 2);
        }

        fn receive(&self) -> Vec<u8> {
            let c = self.next();
            assert_eq!(c.wr_id, 1);
            let m = self.mem.to_vec(0, c.byte_len as usize);
            self.post_recv();
            m
        }

        fn leave(&self) {
            if let Some(c) = self.conn {
                self.cm.disconnect(c);
            }
        }
    }

    fn version() -> Vec<u8> {
        let mut v = vec![0u8; 16];
        v[..4].copy_from_slice(b"6.06");
        v
    }

    #[test]
    fn a_message_of_the_wrong_size_is_refused_with_the_reason() {
        let (srv, _lines) = server(&[
            "write",
            "--iwarp",
            "--bind",
            "127.95.0.15",
            "-R",
            "-p",
            "18607",
            "--timeout",
            "10",
        ]);
        let mut f = Fake::open("127.95.0.16");
        f.connect("127.95.0.16", "127.95.0.15", 18607);
        // A version field must be 16 bytes.
        f.send(b"GET / HTTP/1.1\r\n\r\n");
        let o = finish(srv, 30);
        let err = no_panic(&o);
        assert!(
            err.contains("peer sent 18 bytes where 16 were due while swapping versions"),
            "{err}"
        );
        f.leave();
    }

    #[test]
    fn a_server_that_leaves_mid_exchange_is_named() {
        let mut f = Fake::open("127.95.0.17");
        let port = 18608;
        let rx = f.cm.listen(port).unwrap();
        let client = std::thread::spawn(move || {
            rperftest()
                .args(["read", "127.95.0.17", "--iwarp", "--bind", "127.95.0.18"])
                .args(["-R", "-p", &port.to_string(), "--timeout", "10"])
                .output()
                .unwrap()
        });
        f.accept(&rx);
        // The client sends first; answer its version, then go.
        assert_eq!(&f.receive()[..5], b"6.06\0");
        f.send(&version());
        f.leave();
        let o = client.join().unwrap();
        let err = no_panic(&o);
        assert!(
            err.contains("peer closed the connection while swapping cycle buffer sizes"),
            "{err}"
        );
    }

    #[test]
    fn a_client_that_leaves_mid_exchange_is_named() {
        let (srv, _lines) = server(&[
            "send",
            "--iwarp",
            "--bind",
            "127.95.0.19",
            "-R",
            "-p",
            "18609",
            "--timeout",
            "10",
        ]);
        let mut f = Fake::open("127.95.0.20");
        f.connect("127.95.0.20", "127.95.0.19", 18609);
        f.send(&version());
        assert_eq!(&f.receive()[..5], b"6.06\0");
        f.leave();
        let o = finish(srv, 30);
        let err = no_panic(&o);
        assert!(
            err.contains("peer closed the connection while swapping cycle buffer sizes"),
            "{err}"
        );
    }
}
