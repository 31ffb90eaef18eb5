//! Real processes on 127.0.152.x: an `ibsm run --mkey K --mkey-protect 2`
//! gives an `ib` node's port its M_Key, and a second `ibsm` with the
//! wrong key is refused by the node's SMA (counted, trap 256 to the
//! first SM, which logs it) and gets no port; and a master `ibsm` logs
//! its standby, polls it, and logs it gone after SIGKILL, while only the
//! master's SA answers `saquery`.

mod common;

use common::Ibsm;
use rdma_access::sma::state;
use rdma_types::Guid;
use rnic::softroce::{SoftCa, SoftRoce, ROCE_PORT};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);
const KEY: u64 = 0x5eed_0000_cafe_f00d;

fn ip(last: u8) -> String {
    IpAddr::V4(Ipv4Addr::new(127, 0, 152, last)).to_string()
}

/// Polls `done` until it holds or `within` passes; panics with `what`
/// and the SMs' output then.
fn wait_for(within: Duration, what: &str, sms: &[&Ibsm], mut done: impl FnMut() -> bool) {
    let end = Instant::now() + within;
    while !done() {
        if Instant::now() >= end {
            let outs: Vec<String> = sms.iter().map(|s| s.output()).collect();
            panic!("{what}: not within {within:?}\n{}", outs.join("\n----\n"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Fast timers, so each test takes a couple of seconds.
const FAST: [&str; 6] = [
    "--sweep-interval-ms",
    "300",
    "--timeout-ms",
    "100",
    "--retries",
    "1",
];

#[test]
fn a_protected_port_refuses_an_ibsm_with_the_wrong_key() {
    let (a, rogue, n) = (ip(1), ip(2), ip(3));
    let key = format!("{KEY:#x}");
    let mut args = vec!["--addr", &a, "--node", &n, "--mkey", &key];
    args.extend(["--mkey-protect", "2", "--mkey-lease-secs", "60"]);
    args.extend(FAST);
    let mut sm_a = Ibsm::start("mkey-a", &args);
    let guid = Guid(0x1520_0003);
    let p = SoftRoce::new(
        vec![SoftCa {
            guid,
            ip: n.parse().unwrap(),
        }],
        ROCE_PORT,
    );
    let node = common::ib_node(p, guid, "node-3", false, 3 << 16).unwrap();
    wait_for(T, "node managed with the key", &[&sm_a], || {
        node.sma().port_state() == state::ACTIVE && node.sma().mkey() == (KEY, 2)
    });
    assert_eq!(node.sma().sm_lid(), 1);
    assert_eq!(node.sma().mkey_violations(), 0, "the SM's own key fits");

    // A second SM that does not know the key.
    let mut args = vec!["--addr", &rogue, "--node", &n, "--lid", "50"];
    args.extend(["--mkey", "0xbad"]);
    args.extend(FAST);
    let mut sm_r = Ibsm::start("mkey-r", &args);
    wait_for(T, "refusals counted and reported", &[&sm_a, &sm_r], || {
        node.sma().mkey_violations() >= 3 && sm_a.output().contains("bad M_Key (trap 256)")
    });
    let (ok, out_r) = sm_r.terminate(T);
    assert!(ok, "{out_r}");
    assert!(out_r.contains("0 of 1 ports ACTIVE"), "{out_r}");
    // The first SM still holds the port, with its key.
    assert_eq!(node.sma().sm_lid(), 1);
    assert_eq!(node.sma().mkey(), (KEY, 2));
    assert_eq!(node.sma().port_state(), state::ACTIVE);
    let (ok, out_a) = sm_a.terminate(T);
    assert!(ok, "{out_a}");
    println!(
        "node refused {} SMPs of the wrong-key SM",
        node.sma().mkey_violations()
    );
}

#[test]
fn the_master_ibsm_logs_its_standby_found_and_gone() {
    let (a, b) = (ip(4), ip(5));
    let mut args_a = vec!["--addr", &a, "--node", &b, "--lid", "1", "--priority", "5"];
    args_a.extend(["--poll-interval-ms", "200"]);
    args_a.extend(FAST);
    let mut args_b = vec!["--addr", &b, "--node", &a, "--lid", "2", "--priority", "1"];
    args_b.extend(["--poll-interval-ms", "200"]);
    args_b.extend(FAST);
    let sm_a = Ibsm::start("standby-a", &args_a);
    let mut sm_b = Ibsm::start("standby-b", &args_b);
    let line = |out: &str, what: &str| {
        out.lines()
            .any(|l| l.contains("ibsm: standby SM") && l.contains(what))
    };
    wait_for(T, "standby found", &[&sm_a, &sm_b], || {
        line(&sm_a.output(), "(priority 1)") && sm_b.output().contains("SM state STANDBY")
    });
    // The SA answers on the master only.
    let sa = |at: &str| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_saquery"))
            .env("NICD_MODE", "own")
            .args(["--sa", at, "--ip", &ip(9), "--timeout-ms", "100", "ports"])
            .output()
            .unwrap();
        let out = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        (o.status.success(), out)
    };
    let (ok, out) = sa(&b);
    assert!(!ok, "the standby's SA answered: {out}");
    assert!(out.contains("no answer"), "{out}");
    let (ok, out) = sa(&a);
    assert!(ok && out.contains("1 port records"), "{out}");
    sm_b.kill();
    let t0 = Instant::now();
    wait_for(T, "standby lost", &[&sm_a], || {
        line(&sm_a.output(), "stopped answering")
    });
    // The event, not its speed: the master's poll (every 200 ms, 2 tries of
    // 100 ms) found the standby gone within T, and it is still master. The
    // time is printed: on a busy machine it is a figure, not a verdict.
    println!("master noticed its standby gone in {:?}", t0.elapsed());
    assert!(sm_a.output().contains("SM state MASTER"));
}
