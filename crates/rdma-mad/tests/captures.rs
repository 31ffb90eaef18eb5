//! CM MADs captured from Linux rxe (testdata/mad/cm_mads.hex, made by
//! testdata/mad/extract_cm.py from ../shared/captures): each parses and
//! re-emits byte-identically.

use rdma_mad::cm::{CmAttr, CmMadRepr, CmMessage, CmaHdrRepr};

fn vectors() -> Vec<(String, [u8; 256])> {
    let text = include_str!("../../../testdata/mad/cm_mads.hex");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let hex = f[3];
            let mut mad = [0u8; 256];
            for (i, b) in mad.iter_mut().enumerate() {
                *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
            }
            (format!("{} frame {}", f[0], f[1]), mad)
        })
        .collect()
}

#[test]
fn captured_cm_mads_round_trip() {
    let v = vectors();
    assert_eq!(v.len(), 32);
    let mut counts = std::collections::BTreeMap::new();
    for (name, mad) in &v {
        let repr = CmMadRepr::parse(mad).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            !matches!(repr.message, CmMessage::Other(_)),
            "{name}: not decoded"
        );
        assert_eq!(&repr.to_bytes()[..], &mad[..], "{name}: re-emit differs");
        *counts
            .entry(CmAttr::from(repr.header.attr_id).to_string())
            .or_insert(0) += 1;
    }
    println!("CM MADs round-tripped: {counts:?}");
    for kind in ["REQ", "REP", "RTU", "DREQ", "DREP", "REJ"] {
        assert!(counts.contains_key(kind), "no {kind} in the captures");
    }
}

#[test]
fn rping_req_fields() {
    // linux-rxe-rc-pingpong-and-rping.pcapng frame 101: rping's REQ over RDMA CM.
    let (_, mad) = &vectors()[0];
    let repr = CmMadRepr::parse(mad).unwrap();
    let CmMessage::Req(req) = repr.message else {
        panic!("not a REQ")
    };
    let (ps, _port) = rdma_mad::cm::parse_rdma_cm_service_id(req.service_id).unwrap();
    assert_eq!(ps, rdma_mad::cm::port_space::TCP);
    assert_eq!(req.transport_type, 0); // RC
    let hdr = CmaHdrRepr::parse(&req.private_data).unwrap();
    assert!(hdr.ip_version == 4 || hdr.ip_version == 6);
    println!(
        "REQ sid {:#x} qpn {} psn {} {} -> {}",
        req.service_id,
        req.local_qpn,
        req.starting_psn,
        hdr.src_ip(),
        hdr.dst_ip()
    );
}
