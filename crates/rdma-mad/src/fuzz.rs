//! Fuzz bodies shared by the cargo-fuzz targets (`fuzz/`) and the
//! deterministic test that runs them in CI.

use crate::{cm, dm, mad, rmpp, sa, smp};

/// Runs every parser over `data`; anything that parses must re-emit to
/// bytes that parse to the same value. Panics only on a real bug.
pub fn parse_all(data: &[u8]) {
    if let Ok(m) = mad::MadRepr::parse(data) {
        assert_eq!(&m.to_bytes()[..], &data[..mad::MAD_SIZE]);
        let _ = m.header.status.to_string();
    }
    if let Ok(c) = cm::CmMadRepr::parse(data) {
        let again = cm::CmMadRepr::parse(&c.to_bytes()).expect("re-parse");
        assert_eq!(again, c);
        if let cm::CmMessage::Req(r) = &c.message {
            let _ = cm::CmaHdrRepr::parse(&r.private_data);
        }
        if let cm::CmMessage::Rej(r) = &c.message {
            let _ = (r.reason.to_string(), r.ari_used().len());
        }
    }
    if let Ok(s) = smp::Smp::new_checked(data) {
        let _ = (s.status(), s.direction(), s.data().len());
        let _ = smp::NodeInfo::parse(s.data());
        let _ = smp::node_description(s.data());
        if let Ok(n) = smp::Notice::parse(&data[64..]) {
            let _ = n.trap_gid();
            let t = smp::BadKeyTrap::parse(&n.data_details);
            assert_eq!(smp::BadKeyTrap::parse(&t.emit()), t);
        }
        if let Ok(p) = smp::PortInfo::new_checked(s.data()) {
            let _ = smp::cap_names(p.capability_mask());
        }
    }
    let _ = rmpp::RmppHeader::parse(data);
    let _ = sa::SaHeader::parse(data)
        .map(|h| sa::records(&data[sa::SA_HDR_LEN.min(data.len())..], h.attr_offset).count());
    let _ = sa::PathRecord::parse(data);
    let _ = sa::ServiceRecord::parse(data).map(|r| r.name());
    let _ = sa::InformInfo::parse(data);
    let _ = dm::IocProfile::parse(data).map(|p| p.id());
    let _ = dm::IoUnitInfo::parse(data).map(|i| i.slot(data.first().copied().unwrap_or(0)));
    let _ = dm::parse_service_entries(data, data.len() / 48);
    let _ = dm::ClassPortInfo::parse(data);
}

/// Reassembles `data` cut into 256-byte segments; splits the result again.
pub fn rmpp_round_trip(data: &[u8]) {
    let segs: Vec<&[u8]> = data.chunks(mad::MAD_SIZE).collect();
    if let Ok((hdr, payload)) = rmpp::reassemble(&segs, sa::SA_HDR_LEN) {
        let again = rmpp::segment(&hdr, sa::SA_HDR_LEN, &payload, 0).expect("segment");
        let refs: Vec<&[u8]> = again.iter().map(|s| &s[..]).collect();
        let (_, back) = rmpp::reassemble(&refs, sa::SA_HDR_LEN).expect("reassemble own");
        assert_eq!(back, payload);
    }
}
