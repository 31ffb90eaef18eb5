//! The `ib` personality of the soft RoCE NIC on 127.0.131.1x: an `ib` CA
//! has a QP0 whose SMPs its SMA (`rdma_access::sma_agent`) answers, and
//! the SM's Sets reach the port (LID, SM LID, state, P_Key table, with the
//! verbs events); a `roce` CA has neither. Here a test plays the SM with a
//! MAD agent on another `ib` CA's QP0; `ib-sm`'s tests run the real SM.

use rdma_access::ib_node::{port_control, sma_config};
use rdma_access::sma::{state, SMP_DATA};
use rdma_access::sma_agent::SmaAgent;
use rdma_access::CmAgent;
use rdma_mad::mad::MAD_SIZE;
use rdma_mad::smp::{NodeInfo, PortInfo, SmpAttr};
use rdma_types::{Guid, Lid, Pkey, PortNum, QpType};
use rnic::softroce::{Personality, SoftCa, SoftRoce, ROCE_PORT};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use verbs::{AsyncEvent, AsyncEventKind, CqInit, EventHandler, PortState, Provider, QpInit};

const SM: Guid = Guid(0x1310b);
const NODE: Guid = Guid(0x1310c);
const ROCE: Guid = Guid(0x1310d);

fn ca(guid: Guid, last: u8) -> SoftCa {
    SoftCa {
        guid,
        ip: IpAddr::V4(Ipv4Addr::new(127, 0, 131, last)),
    }
}

#[derive(Default)]
struct Events(Mutex<Vec<AsyncEventKind>>);

impl EventHandler for Events {
    fn on_completion(&self, _: u64) {}
    fn on_async_event(&self, e: AsyncEvent) {
        self.0.lock().unwrap().push(e.kind);
    }
}

/// A directed-route SMP of hop count 0: the port at the other end.
fn smp(method: u8, attr: SmpAttr, data: &[u8]) -> [u8; MAD_SIZE] {
    let mut m = [0u8; MAD_SIZE];
    m[0] = 1;
    m[1] = 0x81;
    m[2] = 1;
    m[3] = method;
    m[16..18].copy_from_slice(&u16::from(attr).to_be_bytes());
    m[SMP_DATA..SMP_DATA + data.len()].copy_from_slice(data);
    m
}

fn port_info(lid: u16, sm_lid: u16, st: u8) -> [u8; 64] {
    let mut b = [0u8; 64];
    let mut p = PortInfo::new_checked(&mut b[..]).unwrap();
    p.set_lid(lid);
    p.set_sm_lid(sm_lid);
    p.set_port_state(st);
    b
}

fn status(r: &[u8]) -> u16 {
    u16::from_be_bytes([r[4], r[5]]) & 0x7fff
}

#[test]
fn an_ib_port_has_qp0_and_its_sma_applies_the_sms_sets() {
    let p = SoftRoce::new(vec![ca(SM, 11), ca(NODE, 12), ca(ROCE, 13)], ROCE_PORT);
    p.set_personality(SM, Personality::Ib).unwrap();
    p.set_personality(NODE, Personality::Ib).unwrap();
    assert_eq!(p.personality(ROCE), Personality::Roce, "roce by default");

    // A roce port: no QP0, so no SMA.
    let roce = CmAgent::start(p.clone(), ROCE, 0x3000).unwrap();
    assert!(!roce.has_smi());
    assert!(SmaAgent::start(&roce, sma_config(ROCE, "r", false), |_, _| {}).is_err());
    // Nor does an SM's port control apply to it.
    assert!(p.set_port_state(ROCE, PortState::Init).is_err());
    assert!(p.set_pkeys(ROCE, &[Pkey(0x8001)]).is_err());

    // The node: its port starts in INIT without a LID.
    let events = Arc::new(Events::default());
    let dev = p.open_ca(NODE, 0, events.clone()).unwrap();
    assert!(matches!(
        p.set_personality(NODE, Personality::Roce),
        Err(verbs::VerbsError::Busy(_))
    ));
    let port = p.query_port(dev, PortNum(1)).unwrap();
    assert_eq!((port.state, port.lid), (PortState::Init, Lid(0)));
    let node = CmAgent::start(p.clone(), NODE, 0x2000).unwrap();
    assert!(node.has_smi(), "an ib port has QP0");
    // One QP0 per port.
    let pd = p.alloc_pd(dev, 0).unwrap();
    let cq = p.create_cq(pd, &CqInit { cqe: 4 }, 0).unwrap();
    let mut init = QpInit::rc(cq, 1, 1);
    init.qp_type = QpType::Smi;
    assert!(matches!(
        p.create_qp(pd, &init, 0),
        Err(verbs::VerbsError::Busy(_))
    ));
    let sma = SmaAgent::start(
        &node,
        sma_config(NODE, "node-12", false),
        port_control(p.clone(), dev),
    )
    .unwrap();

    // The "SM": SMPs from a send-only MAD agent on another ib port's QP0.
    let sm = CmAgent::start(p.clone(), SM, 0x1000).unwrap();
    let a = sm.mad_agent(0x81, 1, &[]).unwrap();
    let ask = |m| {
        a.request(node.gid(), m, Duration::from_millis(300), 3)
            .unwrap()
    };
    let r = ask(smp(0x01, SmpAttr::NodeInfo, &[]));
    assert_eq!((r[3], status(&r[..]), r[4] & 0x80), (0x81, 0, 0x80));
    let info = NodeInfo::parse(&r[SMP_DATA..]).unwrap();
    assert_eq!((info.node_guid, info.port_guid), (NODE, NODE));

    // ACTIVE straight from INIT is refused and changes nothing.
    let r = ask(smp(
        0x02,
        SmpAttr::PortInfo,
        &port_info(7, 1, state::ACTIVE),
    ));
    assert_eq!(status(&r[..]), 0x001c);
    assert_eq!(p.query_port(dev, PortNum(1)).unwrap().lid, Lid(0));
    // INIT -> ARMED with the LID, then ACTIVE.
    let r = ask(smp(0x02, SmpAttr::PortInfo, &port_info(7, 1, state::ARMED)));
    assert_eq!(status(&r[..]), 0);
    let port = p.query_port(dev, PortNum(1)).unwrap();
    assert_eq!((port.state, port.lid), (PortState::Init, Lid(7)));
    let r = ask(smp(
        0x02,
        SmpAttr::PortInfo,
        &port_info(7, 1, state::ACTIVE),
    ));
    assert_eq!(status(&r[..]), 0);
    let port = p.query_port(dev, PortNum(1)).unwrap();
    assert_eq!(
        (port.state, port.lid, port.sm_lid),
        (PortState::Active, Lid(7), Lid(1))
    );
    let mut keys = [0u8; 64];
    keys[..4].copy_from_slice(&[0xff, 0xff, 0x80, 0x05]);
    let r = ask(smp(0x02, SmpAttr::PkeyTable, &keys));
    assert_eq!(status(&r[..]), 0);
    assert_eq!(
        p.query_port(dev, PortNum(1)).unwrap().pkeys,
        vec![Pkey(0xffff), Pkey(0x8005)]
    );
    // GUIDInfo: the SM assigns alias GUIDs; entry 0 stays the port GUID.
    let mut guids = [0u8; 64];
    guids[..8].copy_from_slice(&0xbadu64.to_be_bytes());
    guids[8..16].copy_from_slice(&0x0002_c903_0013_1001u64.to_be_bytes());
    let r = ask(smp(0x02, SmpAttr::GuidInfo, &guids));
    assert_eq!(status(&r[..]), 0);
    assert_eq!(&r[SMP_DATA..SMP_DATA + 8], &NODE.0.to_be_bytes());
    assert_eq!(
        sma.guids()[..3],
        [NODE, Guid(0x0002_c903_0013_1001), Guid(0)]
    );
    // The events came before the answers did (applied first).
    let seen = events.0.lock().unwrap().clone();
    for want in [
        AsyncEventKind::LidChange,
        AsyncEventKind::PortActive,
        AsyncEventKind::PkeyChange,
    ] {
        assert!(seen.contains(&want), "{want:?} missing from {seen:?}");
    }
    assert_eq!(
        (sma.lid(), sma.port_state(), sma.sm_gid()),
        (7, state::ACTIVE, Some(sm.gid()))
    );
    assert_eq!(sma.smps(), 6);

    // DOWN: the link retrains, the port is back in INIT (a port error).
    let r = ask(smp(0x02, SmpAttr::PortInfo, &port_info(0, 1, state::DOWN)));
    assert_eq!(status(&r[..]), 0);
    assert!(sma.wait_state(state::INIT, Duration::from_secs(1)));
    assert!(events.0.lock().unwrap().contains(&AsyncEventKind::PortDown));
    assert_eq!(
        p.query_port(dev, PortNum(1)).unwrap().state,
        PortState::Init
    );

    drop(sma);
    drop(node);
    p.destroy_cq(cq).unwrap();
    p.dealloc_pd(pd).unwrap();
    p.close_ca(dev).unwrap();
}
