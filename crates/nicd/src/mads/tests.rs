use super::*;
use rdma_mad::cm::{CmMadRepr, CmMessage};

const A: ClientId = 1;
const B: ClientId = 2;

fn peer() -> Gid {
    Gid([0xfe; 16])
}

/// A CM MAD of `attr` with local and remote IDs (and a service ID in a
/// REQ, at data offset 8).
fn cm(attr: CmAttr, local: u32, remote: u32, sid: u64) -> Vec<u8> {
    let m = cm_mad(attr, 0x77, |d| {
        put_u32(d, 0, local);
        if attr == CmAttr::Req {
            d[8..16].copy_from_slice(&sid.to_be_bytes());
        } else {
            put_u32(d, 4, remote);
        }
    });
    m.to_vec()
}

fn wire(outs: &[Out]) -> Vec<&MadBytes> {
    outs.iter()
        .filter_map(|o| match o {
            Out::ToWire { mad, .. } => Some(mad),
            Out::ToClient { .. } => None,
        })
        .collect()
}

fn to_client(outs: &[Out]) -> Option<(ClientId, &MadBytes)> {
    outs.iter().find_map(|o| match o {
        Out::ToClient { client, mad, .. } => Some((*client, mad)),
        Out::ToWire { .. } => None,
    })
}

#[test]
fn clients_cm_ids_are_the_daemons_on_the_wire_and_theirs_at_home() {
    let mut r = Router::new(1000);
    r.join(A, false);
    r.join(B, false);
    // Both pick local ID 5 for a REQ.
    let a = r
        .from_client(A, peer(), 0, &cm(CmAttr::Req, 5, 0, 9))
        .unwrap();
    let b = r
        .from_client(B, peer(), 0, &cm(CmAttr::Req, 5, 0, 9))
        .unwrap();
    let (ida, idb) = (u32_at(&wire(&a)[0][..], 24), u32_at(&wire(&b)[0][..], 24));
    assert_ne!(ida, idb);
    assert!(ida != 5 && idb != 5);
    // The peer's REP to B's REQ comes back to B with B's ID in it.
    let rep = r.from_wire(peer(), 0, &cm(CmAttr::Rep, 0x500, idb, 0));
    let (who, mad) = to_client(&rep).expect("delivered");
    assert_eq!((who, u32_at(&mad[..], 28)), (B, 5));
    // B may RTU its own connection, not A's (its peer's ID is 0x500).
    assert!(r
        .from_client(B, peer(), 0, &cm(CmAttr::Rtu, 5, 0x500, 0))
        .is_ok());
    let forged = r.from_client(A, peer(), 0, &cm(CmAttr::Rtu, 5, 0x500, 0));
    assert!(matches!(forged, Err(Refused::Mad(_))), "{forged:?}");
    assert_eq!(r.stats().refused, 1);
}

#[test]
fn a_req_goes_to_its_listener_or_is_rejected_for_the_port() {
    let mut r = Router::new(1);
    r.join(A, false);
    r.join(B, false);
    r.listen(A, 0x42, true).unwrap();
    assert_eq!(r.listen(B, 0x42, true), Err(Refused::Listened(0x42)));
    let out = r.from_wire(peer(), 0, &cm(CmAttr::Req, 0x700, 0, 0x42));
    assert_eq!(to_client(&out).map(|(c, _)| c), Some(A));
    // B may not answer the REQ A was handed.
    let stolen = r.from_client(B, peer(), 0, &cm(CmAttr::Rep, 8, 0x700, 0));
    assert!(stolen.is_err());
    let out = r.from_wire(peer(), 0, &cm(CmAttr::Req, 0x701, 0, 0x43));
    let rej = CmMadRepr::parse(&wire(&out)[0][..]).unwrap();
    let CmMessage::Rej(rej) = rej.message else {
        panic!("{rej:?}")
    };
    assert_eq!(
        (rej.remote_comm_id, rej.reason),
        (0x701, RejReason::InvalidServiceId)
    );
}

#[test]
fn a_departed_client_has_its_peers_told() {
    let mut r = Router::new(1);
    r.join(A, false);
    r.listen(A, 0x42, true).unwrap();
    // An established passive connection, and a REQ handed and unanswered.
    r.from_wire(peer(), 0, &cm(CmAttr::Req, 0x700, 0, 0x42));
    let rep = r
        .from_client(A, peer(), 0, &cm(CmAttr::Rep, 3, 0x700, 0))
        .unwrap();
    let id = u32_at(&wire(&rep)[0][..], 24);
    r.from_wire(peer(), 0, &cm(CmAttr::Rtu, 0x700, id, 0));
    r.from_wire(peer(), 0, &cm(CmAttr::Req, 0x701, 0, 0x42));
    // And one whose REP went out but whose RTU has not come (yet).
    r.from_wire(peer(), 0, &cm(CmAttr::Req, 0x702, 0, 0x42));
    r.from_client(A, peer(), 0, &cm(CmAttr::Rep, 4, 0x702, 0))
        .unwrap();
    let out = r.leave(A);
    let mut told: Vec<(u32, CmAttr)> = wire(&out)
        .iter()
        .map(|m| (u32_at(&m[..], 28), attr_of(&m[..])))
        .collect();
    told.sort_by_key(|t| (t.0, u16::from(t.1)));
    assert_eq!(
        told,
        vec![
            (0x700, CmAttr::Dreq),
            (0x701, CmAttr::Rej),
            (0x702, CmAttr::Rej),
            (0x702, CmAttr::Dreq)
        ]
    );
    // Unanswered DREQs go again, at most DREQ_RESENDS times.
    let again = r.retransmit();
    let again: Vec<u32> = wire(&again).iter().map(|m| u32_at(&m[..], 28)).collect();
    assert_eq!(again, vec![0x700, 0x702]);
    // The peer's DREQ crossing ours gets a DREP from the tombstone, and
    // ends the resends; so does the other peer's DREP.
    let out = r.from_wire(peer(), 0, &cm(CmAttr::Dreq, 0x700, id, 0));
    assert_eq!(attr_of(&wire(&out)[0][..]), CmAttr::Drep);
    let other = r
        .conns
        .iter()
        .find(|(_, c)| c.peer_comm == 0x702)
        .map(|(i, _)| *i)
        .unwrap();
    assert!(r
        .from_wire(peer(), 0, &cm(CmAttr::Drep, 0x702, other, 0))
        .is_empty());
    assert!(r.retransmit().is_empty());
    // The listen is gone with it.
    assert!(r.listen(B, 0x42, true).is_ok());
}

/// A GMP: class, method, TID.
fn gmp(class: u8, method: u8, tid: u64) -> Vec<u8> {
    let mut m = vec![0u8; MAD_SIZE];
    m[0] = 1;
    m[1] = class;
    m[2] = 1;
    m[3] = method;
    set_tid(&mut m, tid);
    m
}

#[test]
fn responses_find_their_requester_by_the_daemons_stamp() {
    let mut r = Router::new(1);
    r.join(A, false);
    r.join(B, false);
    let out = r.from_client(A, peer(), 0, &gmp(0x06, 0x01, 7)).unwrap();
    let stamped = tid_of(&wire(&out)[0][..]);
    assert_ne!(stamped, 7);
    let back = r.from_wire(peer(), 0, &gmp(0x06, 0x81, stamped));
    let (who, mad) = to_client(&back).unwrap();
    assert_eq!((who, tid_of(&mad[..])), (A, 7));
    // A response nobody asked for is dropped; one B does not serve is refused.
    assert!(r.from_wire(peer(), 0, &gmp(0x06, 0x81, 7)).is_empty());
    assert!(r.from_client(B, peer(), 0, &gmp(0x06, 0x81, 9)).is_err());
}

#[test]
fn registrations_are_exclusive_and_privileged_classes_refused() {
    let mut r = Router::new(1);
    r.join(A, false);
    r.join(B, true);
    assert_eq!(r.register(A, 0x01, 1, &[1], true), Err(Refused::Qp0(0x01)));
    assert_eq!(
        r.register(A, 0x03, 2, &[1], true),
        Err(Refused::Privileged(0x03))
    );
    assert!(r.register(B, 0x03, 2, &[1], true).is_ok());
    r.register(A, 0x06, 1, &[1, 2], true).unwrap();
    assert!(matches!(
        r.register(B, 0x06, 1, &[2], true),
        Err(Refused::Taken { .. })
    ));
    // A request for A's class goes to A; one nobody serves is answered.
    let out = r.from_wire(peer(), 0, &gmp(0x06, 0x01, 3));
    assert_eq!(to_client(&out).map(|(c, _)| c), Some(A));
    let out = r.from_wire(peer(), 0, &gmp(0x0a, 0x01, 3));
    let m = wire(&out)[0];
    assert_eq!((m[3], u16::from_be_bytes([m[4], m[5]])), (0x81, 1 << 2));
    // Responses and SMPs from the wire nobody takes are dropped.
    assert!(r.from_wire(peer(), 0, &gmp(0x81, 0x01, 3)).is_empty());
}

#[test]
fn the_sas_reports_go_to_every_client_that_takes_them() {
    let mut r = Router::new(1);
    r.join(A, false);
    r.join(B, false);
    // A Report nobody takes is dropped, never answered (IBA 13.4.7).
    assert!(r.from_wire(peer(), 0, &gmp(0x03, 0x06, 5)).is_empty());
    // SA clients take Reports without serving the class: no privilege,
    // and not exclusive.
    r.register(A, 0x03, 1, &[0x06], true).unwrap();
    r.register(B, 0x03, 1, &[0x06], true).unwrap();
    assert!(!r.serves_class(0x03));
    let out = r.from_wire(peer(), 0, &gmp(0x03, 0x06, 5));
    let mut got: Vec<ClientId> = out
        .iter()
        .filter_map(|o| match o {
            Out::ToClient { client, mad, .. } => {
                assert_eq!(tid_of(&mad[..]), 5);
                Some(*client)
            }
            Out::ToWire { .. } => None,
        })
        .collect();
    got.sort_unstable();
    assert_eq!(got, vec![A, B]);
    // Each answers with its ReportResp; a client that takes none may not.
    assert!(r.from_client(A, peer(), 0, &gmp(0x03, 0x86, 5)).is_ok());
    r.register(B, 0x03, 1, &[0x06], false).unwrap();
    assert!(r.from_client(B, peer(), 0, &gmp(0x03, 0x86, 5)).is_err());
    // A client that leaves takes no more.
    r.leave(A);
    assert!(r.from_wire(peer(), 0, &gmp(0x03, 0x06, 6)).is_empty());
}

#[test]
fn a_dreq_nobody_answers_is_sent_a_bounded_number_of_times() {
    let mut r = Router::new(1);
    r.join(A, false);
    let out = r
        .from_client(A, peer(), 0, &cm(CmAttr::Req, 1, 0, 5))
        .unwrap();
    let id = u32_at(&wire(&out)[0][..], 24);
    r.from_wire(peer(), 0, &cm(CmAttr::Rep, 0x900, id, 0));
    r.from_client(A, peer(), 0, &cm(CmAttr::Rtu, 1, 0x900, 0))
        .unwrap();
    assert_eq!(wire(&r.leave(A)).len(), 1);
    for _ in 0..DREQ_RESENDS {
        assert_eq!(wire(&r.retransmit()).len(), 1);
    }
    assert!(r.retransmit().is_empty());
}
