//! Wraps MADs we emit in RoCEv2 UD frames (Ethernet/IPv4/UDP 4791/BTH/DETH/
//! MAD/ICRC) inside a pcap and asks tshark to decode them: no malformed
//! packets, no expert warnings, and the class/attribute tshark sees are ours.
//! Needs tshark (`rdma_testkit::need`: a skip, or a failure under `CI=true`).

use rdma_mad::cm::{CmAttr, CmMadRepr, CmMessage, MsgRef, RejReason, RejRepr};
use rdma_mad::mad::{MadHeaderRepr, Method, MgmtClass, MAD_SIZE};
use rdma_mad::sa::{PathRecord, SaAttr, SaHeader, SA_CLASS_VERSION, SA_HDR_LEN};
use rdma_mad::smp::{NodeInfo, PortInfo, Smp, SmpAttr};
use rdma_mad::{rmpp, smp};
use rdma_types::{Gid, Guid, Pkey};

/// A GSI (QP1) frame of `mad`.
fn frame(mad: &[u8; MAD_SIZE], psn: u32) -> Vec<u8> {
    rdma_testkit::mad_frame(1, mad, psn)
}

fn gid(last: u8) -> Gid {
    Gid([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, last])
}

fn mads() -> Vec<(&'static str, [u8; MAD_SIZE])> {
    let mut out = Vec::new();
    // CM: a captured REQ re-emitted by us, and a REJ we build.
    let line = include_str!("../../../testdata/mad/cm_mads.hex")
        .lines()
        .nth(1)
        .unwrap();
    let hex = line.split_whitespace().nth(3).unwrap();
    let raw: Vec<u8> = (0..256)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    out.push(("CM REQ", CmMadRepr::parse(&raw).unwrap().to_bytes()));
    let rej = CmMadRepr {
        header: CmMadRepr::header_for(CmAttr::Rej, 0x55),
        message: CmMessage::Rej(Box::new(RejRepr {
            local_comm_id: 0x1111,
            remote_comm_id: 0x2222,
            message_rejected: MsgRef::Req,
            reject_info_len: 0,
            reason: RejReason::InvalidServiceId,
            ari: [0; 72],
            private_data: [0; 148],
        })),
    };
    out.push(("CM REJ", rej.to_bytes()));
    // SA: a PathRecord Get and a 3-record GetTableResp (2 RMPP segments).
    let pr = PathRecord {
        service_id: 0,
        dgid: gid(2),
        sgid: gid(1),
        dlid: 0xffff,
        slid: 0xffff,
        raw_traffic: false,
        flow_label: 0,
        hop_limit: 64,
        tclass: 0,
        reversible: true,
        numb_path: 1,
        pkey: Pkey(0xffff),
        qos_class: 0,
        sl: 0,
        mtu_selector: 2,
        mtu: 3,
        rate_selector: 2,
        rate: 7,
        packet_life_selector: 2,
        packet_life: 18,
        preference: 0,
    };
    let mut get = [0u8; MAD_SIZE];
    MadHeaderRepr::new(
        MgmtClass::SubnAdm,
        SA_CLASS_VERSION,
        Method::Get,
        0x77,
        SaAttr::PathRecord.into(),
    )
    .emit(&mut get);
    SaHeader {
        comp_mask: 0x0c,
        ..Default::default()
    }
    .emit(&mut get); // DGID | SGID
    pr.emit(&mut get[SA_HDR_LEN..]);
    out.push(("SA Get PathRecord", get));
    let mut template = [0u8; SA_HDR_LEN];
    MadHeaderRepr::new(
        MgmtClass::SubnAdm,
        SA_CLASS_VERSION,
        Method::GetTableResp,
        0x78,
        SaAttr::PathRecord.into(),
    )
    .emit(&mut template);
    SaHeader {
        attr_offset: 8,
        ..Default::default()
    }
    .emit(&mut template);
    let mut data = Vec::new();
    for _ in 0..4 {
        let mut b = [0u8; 64];
        pr.emit(&mut b);
        data.extend_from_slice(&b);
    }
    let segs = rmpp::segment(&template, SA_HDR_LEN, &data, 0).unwrap();
    assert_eq!(segs.len(), 2);
    for s in segs {
        out.push(("SA GetTableResp segment", s));
    }
    // SMP: LID-routed NodeInfo GetResp and directed-route PortInfo Get.
    let mut ni = [0u8; MAD_SIZE];
    let mut h = MadHeaderRepr::new(
        MgmtClass::SubnLid,
        1,
        Method::GetResp,
        0x99,
        SmpAttr::NodeInfo.into(),
    );
    h.emit(&mut ni);
    NodeInfo {
        base_version: 1,
        class_version: 1,
        node_type: 1,
        num_ports: 1,
        system_image_guid: Guid(0x0211_22ff_fe33_4455),
        node_guid: Guid(0x0211_22ff_fe33_4455),
        port_guid: Guid(0x0211_22ff_fe33_4455),
        partition_cap: 64,
        device_id: 0,
        revision: 1,
        local_port_num: 1,
        vendor_id: 0xffffff,
    }
    .emit(&mut ni[64..]);
    out.push(("SMP NodeInfo", ni));
    let mut dr = [0u8; MAD_SIZE];
    h = MadHeaderRepr::new(
        MgmtClass::SubnDirected,
        1,
        Method::Get,
        0x9a,
        SmpAttr::PortInfo.into(),
    );
    h.attr_mod = 1;
    h.emit(&mut dr);
    {
        let mut v = Smp::new_checked(&mut dr[..]).unwrap();
        v.set_hop_count(1);
        v.set_hop_pointer(0);
        v.set_dr_slid(0xffff);
        v.set_dr_dlid(0xffff);
        v.initial_path_mut()[1] = 1;
        let mut p = PortInfo::new_checked(v.data_mut()).unwrap();
        p.set_lid(7);
        p.set_capability_mask(smp::cap::IS_CM_SUPPORTED | smp::cap::IS_TRAP_SUPPORTED);
        p.set_port_state(4);
        p.set_phys_state(5);
    }
    out.push(("SMP DR PortInfo", dr));
    out
}

#[test]
fn tshark_decodes_our_mads() {
    if !rdma_testkit::need::tool(rdma_testkit::TSHARK) {
        return;
    }
    let mads = mads();
    let mut frames: Vec<Vec<u8>> = mads
        .iter()
        .enumerate()
        .map(|(i, (_, m))| frame(m, i as u32))
        .collect();
    // Negative control: a cut SA MAD must be flagged, or the check below proves nothing.
    let mut cut = frame(&mads[2].1, 99);
    cut.truncate(14 + 20 + 8 + 20 + 60);
    frames.push(cut);
    let path = std::env::temp_dir().join(format!("rdma-mad-tshark-{}.pcap", std::process::id()));
    std::fs::write(&path, rdma_testkit::pcap(&frames)).unwrap();
    let out = std::process::Command::new(rdma_testkit::TSHARK)
        .args([
            "-r",
            path.to_str().unwrap(),
            "-o",
            "infiniband.dissect_eoib:FALSE",
        ])
        .args([
            "-T",
            "fields",
            "-e",
            "frame.number",
            "-e",
            "infiniband.mad.mgmtclass",
            "-e",
            "infiniband.mad.attributeid",
            "-e",
            "_ws.malformed",
            "-e",
            "_ws.expert",
        ])
        .output();
    let out = match out {
        Ok(o) if o.status.success() => o,
        _ => {
            // Older tshark may lack the preference; retry without it.
            std::process::Command::new(rdma_testkit::TSHARK)
                .args(["-r", path.to_str().unwrap()])
                .args([
                    "-T",
                    "fields",
                    "-e",
                    "frame.number",
                    "-e",
                    "infiniband.mad.mgmtclass",
                    "-e",
                    "infiniband.mad.attributeid",
                    "-e",
                    "_ws.malformed",
                    "-e",
                    "_ws.expert",
                ])
                .output()
                .unwrap()
        }
    };
    let _ = std::fs::remove_file(&path);
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len(),
        mads.len() + 1,
        "tshark saw a different frame count"
    );
    assert!(
        lines[mads.len()].contains("_ws.malformed")
            || lines[mads.len()].split('\t').skip(3).any(|x| !x.is_empty()),
        "negative control not flagged: {}",
        lines[mads.len()]
    );
    for ((name, mad), line) in mads.iter().zip(&lines) {
        let f: Vec<&str> = line.split('\t').collect();
        assert!(f.len() >= 3, "{name}: {line}");
        let class = u8::from_str_radix(f[1].trim_start_matches("0x"), 16).unwrap_or(0xff);
        assert_eq!(class, mad[1], "{name}: class as tshark sees it");
        let attr = u16::from_str_radix(f[2].trim_start_matches("0x"), 16).unwrap_or(0xffff);
        assert_eq!(
            attr,
            u16::from_be_bytes([mad[16], mad[17]]),
            "{name}: attribute"
        );
        let malformed = f.get(3).copied().unwrap_or("");
        let expert = f.get(4).copied().unwrap_or("");
        assert!(
            malformed.is_empty() && expert.is_empty(),
            "{name}: tshark flags it: {line}"
        );
    }
}
