//! SRP over iWARP through RDMA CM: a target port and its login service
//! (`srp_target::cm::serve_cm`) on one NIC, an initiator session through
//! `srp_initiator`'s RDMA CM connector on the other, both with
//! `iwarp_tcp::IwarpCm` as their RDMA CM. Login, verified I/O, logout
//! seen by the target, a second login.

use iwarp_tcp::{IwarpCa, IwarpCm, SoftIwarp};
use srp::initiator::ChannelConfig;
use srp::target::TargetConfig;
use srp_initiator::connectors::RdmaCmConnector;
use srp_initiator::disk::Disk;
use srp_initiator::session::{Session, SessionConfig};
use srp_target::cm::{serve_cm, ChannelEnd, Listen, LoginEvent};
use srp_target::{PortOptions, TargetPort};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

fn ip(d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 94, 207, d))
}

#[test]
fn srp_login_and_verified_io_over_iwarp_rdma_cm() {
    let (ini, tgt) = (IwarpCa::at(ip(1)), IwarpCa::at(ip(2)));
    let (gi, gt) = (ini.guid, tgt.guid);
    let p = SoftIwarp::new(vec![ini, tgt]);
    let provider: Arc<dyn verbs::Provider> = p.clone();

    let chan = ChannelConfig::new(0x11, gi, gt.0, gt);
    let scsi = Arc::new(scsi::Target::new());
    let ram = scsi::Device::new(
        scsi::DeviceConfig::default(),
        Arc::new(scsi::Ram::new(16 << 20)),
    )
    .unwrap();
    scsi.add_lun(None, scsi::Lun::new(0).unwrap(), Arc::new(ram));
    let port = Arc::new(
        TargetPort::start(
            provider.clone(),
            gt,
            TargetConfig::new(chan.target_port_id(), "iwarp"),
            scsi,
            PortOptions::default(),
        )
        .unwrap(),
    );
    let target_cm = IwarpCm::new(p.clone(), gt);
    let (events, logins) = std::sync::mpsc::channel();
    let events = std::sync::Mutex::new(events);
    let _threads = serve_cm(
        target_cm,
        None,
        port.clone(),
        Listen {
            rdma_cm_port: Some(5010),
            ib_service_id: None,
        },
        move |e| {
            println!("target: {e:?}");
            let _ = events.lock().unwrap().send(e);
        },
    )
    .unwrap();

    let initiator_cm = IwarpCm::new(p.clone(), gi);
    let connector = Arc::new(RdmaCmConnector {
        agent: initiator_cm,
        src: ip(1),
        dst: SocketAddr::new(ip(2), 5010),
        timeout: Duration::from_secs(10),
    });
    for round in 0..2 {
        let sess = Arc::new(
            Session::connect(
                provider.clone(),
                gi,
                connector.clone(),
                SessionConfig::new(chan.clone()),
            )
            .unwrap(),
        );
        assert!(sess.negotiated().req_lim > 1);
        let e = logins.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(matches!(e, LoginEvent::Accepted { .. }), "{e:?}");
        assert_eq!(port.sessions().len(), 1, "round {round}");
        let disk = Disk::open(sess.clone(), 0).unwrap();
        assert_eq!(disk.info().blocks, (16 << 20) / 512);
        let disk: Arc<dyn blockload::BlockDevice> = Arc::new(disk);
        let mut w = blockload::Workload::new(blockload::Pattern::RandRw { read_pct: 50 });
        w.jobs = 2;
        w.verify = true;
        w.region = Some(4 << 20);
        w.size = Some(8 << 20);
        w.runtime = Duration::from_secs(60);
        let r = blockload::run(disk.clone(), &w, |_| {}).unwrap();
        assert!(r.ok(), "{}", r.table());
        assert!(r.verified_bytes > 1 << 20, "{}", r.table());
        drop(disk);
        // Logout: the target hears the stream close and drops the session.
        drop(sess);
        let e = logins.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(
            matches!(
                e,
                LoginEvent::Closed {
                    reason: ChannelEnd::CmEnded,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(port.sessions().is_empty(), "the target kept the session");
    }
}
