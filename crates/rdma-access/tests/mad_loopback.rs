//! The port's MAD services over the loopback provider: the DM agent, the
//! CM and status replies share QP1; requests to nobody retry and time
//! out; discovery and CM connections complete under 5 % MAD loss.

mod mad_common;
use mad_common::{dm_and_cm_share_qp1, dm_and_cm_under_loss, pair, Kind};

#[test]
fn loopback_dm_cm_status_and_timeout_share_qp1() {
    dm_and_cm_share_qp1(&pair(Kind::Loopback, 0, 0.0));
}

#[test]
fn loopback_dm_and_cm_complete_under_five_percent_loss() {
    dm_and_cm_under_loss(&pair(Kind::Loopback, 0, 0.05));
}

#[test]
fn loopback_smps_travel_on_qp0() {
    let p = pair(Kind::Loopback, 0, 0.0);
    assert!(p.a.has_smi() && p.b.has_smi());
    let t = std::time::Duration::from_millis(200);
    let sm = p.b.mad_agent(0x81, 1, &[]).unwrap();
    let mut smp = [0u8; 256];
    smp[..4].copy_from_slice(&[1, 0x81, 1, 0x01]);
    smp[16..18].copy_from_slice(&0x0011u16.to_be_bytes()); // NodeInfo
                                                           // No SMA on A yet: the unsupported-class status, direction bit set.
    let r = sm.request(p.a.gid(), smp, t, 0).unwrap();
    assert_eq!((r[3], u16::from_be_bytes([r[4], r[5]])), (0x81, 0x8004));
    // An SMA agent on A gets the SMP (over QP0) and answers it.
    let sma = p.a.mad_agent(0x81, 1, &[0x01, 0x02]).unwrap();
    let answer = std::thread::spawn(move || {
        let (peer, req) = sma.recv(std::time::Duration::from_secs(5)).unwrap();
        let mut resp = *req;
        resp[3] = 0x81;
        resp[4] = 0x80; // direction: returning
        resp[64] = 0x5a;
        sma.send(peer, resp);
    });
    let r = sm.request(p.a.gid(), smp, t, 3).unwrap();
    answer.join().unwrap();
    assert_eq!((r[3], r[64]), (0x81, 0x5a));
}
