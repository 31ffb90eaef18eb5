//! `ibstat` on live soft RoCE CAs at 127.0.158.x: two RoCE CAs listed as
//! text and JSON with the fields the verbs interface reports; an `ib` CA
//! that `ibsm run` activates, listed with the LID, SM LID, state and
//! P_Keys the SM set; bad input and a busy address give clear errors.

use rdma_types::{Gid, Guid};
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Child, Command};

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 158, last))
}

/// The GUID the tool gives the CA at `ip` (prefix 0002c903, last 32 bits).
fn guid(last: u8) -> Guid {
    let IpAddr::V4(a) = ip(last) else {
        unreachable!()
    };
    Guid(0x0002_c903_0000_0000 | u64::from(u32::from(a)))
}

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ibstat(args: &[&str]) -> (bool, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_ibstat"))
        .env("NICD_MODE", "own")
        .args(args)
        .output()
        .unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn roce_cas_are_listed_as_text_and_json() {
    let (ok, out, err) = ibstat(&["--ip", "127.0.158.1", "--ip", "127.0.158.2"]);
    assert!(ok, "{err}");
    for last in [1u8, 2] {
        let ca = format!("CA 'roce {}'\n", ip(last));
        let at = out
            .find(&ca)
            .unwrap_or_else(|| panic!("{ca} missing: {out}"));
        let section = &out[at..];
        let section = &section[..section[1..].find("CA '").map_or(section.len(), |e| e + 1)];
        for want in [
            format!("\tNode GUID: 0x{:016x}\n", guid(last).0),
            "\tNumber of ports: 1\n".to_string(),
            "\tPort 1:\n".to_string(),
            "\t\tState: Active\n".to_string(),
            "\t\tPhysical state: LinkUp\n".to_string(),
            "\t\tBase lid: 0\n".to_string(),
            "\t\tSM lid: 0\n".to_string(),
            format!("\t\tPort GUID: 0x{:016x}\n", guid(last).0),
            "\t\tLink layer: Ethernet\n".to_string(),
            format!("\t\tGID[0]: {}\n", Gid::from_ip(ip(last))),
            "\t\tP_Key[0]: 0xffff\n".to_string(),
            "\t\tCapability mask: 0x00010000 (IsCommunicationManagementSupported)\n".to_string(),
        ] {
            assert!(section.contains(&want), "{want:?} missing from {section}");
        }
        assert!(section.contains("\t\tActive MTU: "), "{section}");
        assert!(section.contains("max_qp "), "{section}");
    }
    let (ok, json, err) = ibstat(&["--ip", "127.0.158.1", "--json"]);
    assert!(ok, "{err}");
    let json = json.trim();
    assert!(
        json.starts_with("{\"cas\":[{") && json.ends_with("}]}"),
        "{json}"
    );
    assert_eq!(
        json.matches('{').count(),
        json.matches('}').count(),
        "{json}"
    );
    for want in [
        "\"name\":\"roce 127.0.158.1\"".to_string(),
        "\"link_layer\":\"Ethernet\"".to_string(),
        format!("\"node_guid\":\"0x{:016x}\"", guid(1).0),
        "\"state\":\"Active\"".to_string(),
        "\"lid\":0".to_string(),
        "\"sm_lid\":0".to_string(),
        format!("\"gids\":[\"{}\"]", Gid::from_ip(ip(1))),
        "\"pkeys\":[\"0xffff\"]".to_string(),
        "\"capability_mask\":\"0x00010000\"".to_string(),
    ] {
        assert!(json.contains(&want), "{want} missing from {json}");
    }
}

#[test]
fn an_ib_ca_shows_what_the_sm_set() {
    let _sm = Kill(
        Command::new(env!("CARGO_BIN_EXE_ibsm"))
            .env("NICD_MODE", "own")
            .args(["run", "--addr", "127.0.158.3", "--node", "127.0.158.4"])
            .args(["--sweep-interval-ms", "200", "--lid", "1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (ok, json, err) = ibstat(&[
        "--fabric",
        "ib",
        "--ip",
        "127.0.158.4",
        "--wait-active-ms",
        "10000",
        "--json",
    ]);
    assert!(ok, "{err}");
    for want in [
        "\"name\":\"ib 127.0.158.4\"",
        "\"link_layer\":\"InfiniBand\"",
        "\"state\":\"Active\"",
        "\"sm_lid\":1",
        "\"IsTrapSupported\"",
        "\"IsCommunicationManagementSupported\"",
    ] {
        assert!(json.contains(want), "{want} missing from {json}");
    }
    let lid: u16 = json
        .split("\"lid\":")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no lid in {json}"));
    assert!(
        lid != 0 && lid != 1,
        "the SM gave the port its own LID: {json}"
    );
    assert!(json.contains("\"pkeys\":[\""), "{json}");
    // Without an SM the port waits in INIT with no LID.
    let (ok, out, err) = ibstat(&["--fabric", "ib", "--ip", "127.0.158.5"]);
    assert!(ok, "{err}");
    assert!(out.contains("\t\tState: Initializing\n"), "{out}");
    assert!(out.contains("\t\tBase lid: 0\n"), "{out}");
    assert!(out.contains("\t\tLink layer: InfiniBand\n"), "{out}");
}

#[test]
fn bad_input_is_refused_clearly() {
    let (ok, _, err) = ibstat(&["--ip", "not-an-address"]);
    assert!(!ok);
    assert!(err.contains("--ip"), "{err}");
    let (ok, _, err) = ibstat(&[]);
    assert!(!ok);
    assert!(err.contains("--ip"), "{err}");
    let (ok, _, err) = ibstat(&["--ip", "127.0.158.6", "--ip", "127.0.158.6"]);
    assert!(!ok);
    assert!(err.contains("given twice"), "{err}");
    // An address another process holds.
    let sock = std::net::UdpSocket::bind("127.0.158.6:4791").unwrap();
    let (ok, _, err) = ibstat(&["--ip", "127.0.158.6"]);
    assert!(!ok, "a busy address was listed");
    assert!(err.contains("127.0.158.6"), "{err}");
    drop(sock);
}

/// With no soft RoCE CA asked for, ibstat lists rdma-core's devices; where
/// there is none to list (no library, no RDMA in the kernel, no device),
/// it says why in one line, and a device it does not know is named with
/// those it knows.
#[test]
fn without_ip_it_lists_rdma_core_devices_or_says_why_not() {
    let (ok, out, err) = ibstat(&[]);
    if !ok {
        let line = err.trim();
        assert!(!line.contains('\n') && !line.contains("panicked"), "{err}");
        assert!(
            line.contains("apt-get install libibverbs1")
                || line.contains("no RDMA in this kernel")
                || line.contains("rdma-core lists no RDMA device"),
            "{err}"
        );
    } else {
        assert!(out.contains("CA '"), "{out}");
    }
    let (ok, _, err) = ibstat(&["--device", "nosuch9"]);
    assert!(!ok);
    assert!(
        err.contains("no RDMA device named nosuch9")
            || err.contains("no RDMA in this kernel")
            || err.contains("apt-get install libibverbs1"),
        "{err}"
    );
}
