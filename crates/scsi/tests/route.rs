//! Routes (`Target::route`, `Target::submit_routed`): a READ or WRITE
//! through a route kept from an earlier command answers exactly as one
//! looked up afresh, whatever changed in between: unit attentions, the
//! LUN maps, the port's group state, a first sight of the nexus.

mod common;

use common::*;
use scsi::*;
use std::sync::Arc;

fn ram(blocks: u64) -> Arc<Device> {
    Arc::new(Device::new(DeviceConfig::default(), Arc::new(Ram::new(blocks * 512))).unwrap())
}

fn read10(lba: u32) -> [u8; 10] {
    let mut c = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c
}

fn write10(lba: u32) -> [u8; 10] {
    let mut c = read10(lba);
    c[0] = 0x2a;
    c
}

/// A READ or WRITE of one block at `lba` of `lun` through `route`, as a
/// transport runs it: the route brought up to date, then the command.
fn routed(
    t: &Target,
    n: &Nexus,
    route: &mut Route,
    lun: Lun,
    cdb: &[u8],
    data: &[u8],
) -> ScsiResponse {
    t.route(n, lun, route);
    t.submit_routed(route, n, lun, 7, TaskAttr::Simple, cdb, data, 512, None)
}

/// A READ through `route` as it stands (not brought up to date first).
fn as_made(t: &Target, n: &Nexus, route: &Route, lun: Lun, cdb: &[u8]) -> ScsiResponse {
    t.submit_routed(route, n, lun, 1, TaskAttr::Simple, cdb, &[], 512, None)
}

fn attention(r: &ScsiResponse) -> Asc {
    assert_eq!(r.status, Status::CheckCondition, "{:?}", r.sense);
    let s = r.sense.expect("sense");
    assert_eq!(s.key, SenseKey::UnitAttention, "{s}");
    s.asc
}

fn good(r: &ScsiResponse) -> &[u8] {
    assert_eq!(
        r.status,
        Status::Good,
        "{:?}",
        r.sense.map(|s| s.to_string())
    );
    &r.data_in
}

#[test]
fn a_first_sight_still_gets_its_power_on_attention() {
    let t = Target::new();
    t.add_lun(None, l0(), ram(8));
    let n = Nexus::new("a", "p");
    let mut route = Route::default();
    let r = routed(&t, &n, &mut route, l0(), &read10(0), &[]);
    assert_eq!(attention(&r), Asc::POWER_ON_RESET);
    good(&routed(&t, &n, &mut route, l0(), &read10(0), &[]));
}

#[test]
fn an_attention_raised_after_the_route_was_made_is_reported() {
    let (t, n) = target(Device::new(DeviceConfig::default(), Arc::new(Ram::new(8 * 512))).unwrap());
    let other = Nexus::new("b", "p");
    let mut route = Route::default();
    good(&routed(&t, &n, &mut route, l0(), &read10(0), &[]));
    // Made current, then an attention arrives before the command runs (a
    // reset from another initiator between a transport's look and its
    // submit): the command reports it.
    t.route(&n, l0(), &mut route);
    t.task_management(&other, l0(), Tmf::LogicalUnitReset);
    let r = as_made(&t, &n, &route, l0(), &read10(0));
    assert_eq!(attention(&r), Asc::BUS_DEVICE_RESET);
    good(&routed(&t, &n, &mut route, l0(), &read10(0), &[]));
    // And through a route brought up to date after the reset.
    t.task_management(&other, l0(), Tmf::LogicalUnitReset);
    let r = routed(&t, &n, &mut route, l0(), &write10(1), &[0x5a; 512]);
    assert_eq!(attention(&r), Asc::BUS_DEVICE_RESET);
}

#[test]
fn a_changed_map_reaches_the_new_device() {
    let (t, n) = target(Device::new(DeviceConfig::default(), Arc::new(Ram::new(8 * 512))).unwrap());
    let mut route = Route::default();
    good(&routed(&t, &n, &mut route, l0(), &write10(2), &[0x11; 512]));
    t.route(&n, l0(), &mut route);
    // LUN 0 now maps another device: a route made before is stale.
    t.add_lun(None, l0(), ram(8));
    let r = as_made(&t, &n, &route, l0(), &read10(2));
    assert_eq!(attention(&r), Asc::REPORTED_LUNS_DATA_CHANGED);
    let r = routed(&t, &n, &mut route, l0(), &read10(2), &[]);
    assert_eq!(
        good(&r),
        &[0u8; 512][..],
        "read from the device LUN 0 maps now"
    );
    // Gone from the map: LOGICAL UNIT NOT SUPPORTED, not the old device.
    t.route(&n, l0(), &mut route);
    t.remove_lun(None, l0());
    let r = as_made(&t, &n, &route, l0(), &read10(2));
    assert_eq!(r.status, Status::CheckCondition);
    assert_eq!(r.sense.unwrap().asc, Asc::LOGICAL_UNIT_NOT_SUPPORTED);
}

#[test]
fn a_route_serves_only_the_lun_it_was_made_for() {
    let (t, n) = target(Device::new(DeviceConfig::default(), Arc::new(Ram::new(8 * 512))).unwrap());
    let l1 = Lun::new(1).unwrap();
    t.add_lun(None, l1, ram(8));
    // Mapping LUN 1 changed what LUN 0's nexus sees; and LUN 1 is new to
    // the nexus: each reports its own attention first.
    let mut route = Route::default();
    let r = routed(&t, &n, &mut route, l0(), &write10(3), &[0x22; 512]);
    assert_eq!(attention(&r), Asc::REPORTED_LUNS_DATA_CHANGED);
    good(&routed(&t, &n, &mut route, l0(), &write10(3), &[0x22; 512]));
    let r = routed(&t, &n, &mut route, l1, &read10(3), &[]);
    assert_eq!(attention(&r), Asc::POWER_ON_RESET);
    let r = routed(&t, &n, &mut route, l1, &read10(3), &[]);
    assert_eq!(good(&r), &[0u8; 512][..]);
    // A route made for LUN 1, handed a command for LUN 0, is not taken.
    let r = as_made(&t, &n, &route, l0(), &read10(3));
    assert_eq!(good(&r), &[0x22u8; 512][..]);
}

#[test]
fn a_port_made_standby_refuses_what_its_route_allowed() {
    let (t, n) = target(Device::new(DeviceConfig::default(), Arc::new(Ram::new(8 * 512))).unwrap());
    t.set_relative_port_id("p", 1).unwrap();
    t.set_alua(Alua {
        groups: vec![PortGroup {
            id: 1,
            state: AccessState::ActiveOptimized,
            preferred: true,
            ports: vec![1],
            status: Default::default(),
        }],
        explicit: false,
        transition_secs: 10,
    });
    let mut route = Route::default();
    // The change raised its own attention: taken first.
    let r = routed(&t, &n, &mut route, l0(), &read10(0), &[]);
    assert_eq!(attention(&r), Asc::ASYMMETRIC_ACCESS_STATE_CHANGED);
    good(&routed(&t, &n, &mut route, l0(), &read10(0), &[]));
    t.route(&n, l0(), &mut route);
    t.set_group_state(1, AccessState::Standby).unwrap();
    let r = as_made(&t, &n, &route, l0(), &read10(0));
    assert_eq!(r.status, Status::CheckCondition);
    let r = routed(&t, &n, &mut route, l0(), &read10(0), &[]);
    let s = r.sense.expect("sense");
    assert_eq!(
        (s.key, s.asc),
        (SenseKey::NotReady, Asc::LU_NOT_ACCESSIBLE_STANDBY),
        "{s}"
    );
}

#[test]
fn reads_and_writes_through_a_route_move_the_data() {
    let (t, n) = target(Device::new(DeviceConfig::default(), Arc::new(Ram::new(8 * 512))).unwrap());
    let mut route = Route::default();
    for lba in 0..8u32 {
        good(&routed(
            &t,
            &n,
            &mut route,
            l0(),
            &write10(lba),
            &[lba as u8 + 1; 512],
        ));
    }
    for lba in 0..8u32 {
        let r = routed(&t, &n, &mut route, l0(), &read10(lba), &[]);
        assert_eq!(good(&r), &[lba as u8 + 1; 512][..]);
        assert_eq!(r.residual, Residual::None);
    }
    // Past the end: the device's own answer, as without a route.
    let r = routed(&t, &n, &mut route, l0(), &read10(8), &[]);
    let s = r.sense.expect("sense");
    assert_eq!(s.asc, Asc::LBA_OUT_OF_RANGE);
    // Its data counts for the unrouted path too.
    assert_eq!(ok(&t, &n, &read10(5), &[], 512), vec![6u8; 512]);
}

/// A gated store that says it never blocks, so routed SIMPLE READs and
/// WRITEs to it run inline (held at the gate meanwhile).
struct HeldInline(Arc<Gated>);

impl Backend for HeldInline {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.0.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> std::io::Result<()> {
        self.0.write(offset, data, fua)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.0.flush()
    }
    fn never_blocks(&self) -> bool {
        true
    }
}

/// A target with a held-inline store of `depth` tasks at LUN 0, nexuses
/// `a` and `b` past their power-on attention, and the gate's arrivals.
fn held(
    depth: u32,
) -> (
    Arc<Target>,
    Arc<Gated>,
    std::sync::mpsc::Receiver<()>,
    Nexus,
    Nexus,
) {
    let (g, rx) = Gated::new(16);
    let config = DeviceConfig {
        queue_depth: depth,
        ..DeviceConfig::default()
    };
    let dev = Device::new(config, Arc::new(HeldInline(g.clone()))).unwrap();
    let t = Target::new();
    t.add_lun(None, l0(), Arc::new(dev));
    let (a, b) = (Nexus::new("a", "p"), Nexus::new("b", "p"));
    for n in [&a, &b] {
        assert_eq!(
            attention(&t.execute(n, l0(), &[0; 6], &[], 0)),
            Asc::POWER_ON_RESET
        );
    }
    (Arc::new(t), g, rx, a, b)
}

/// A routed READ of LBA `lba` on a thread of its own.
fn spawn_routed_read(
    t: &Arc<Target>,
    n: &Nexus,
    lba: u32,
) -> std::thread::JoinHandle<ScsiResponse> {
    let (t, n) = (t.clone(), n.clone());
    std::thread::spawn(move || {
        let mut route = Route::default();
        routed(&t, &n, &mut route, l0(), &read10(lba), &[])
    })
}

#[test]
fn an_ordered_task_waits_for_an_older_inline_one() {
    let (t, g, rx, a, b) = held(8);
    let h1 = spawn_routed_read(&t, &a, 5);
    rx.recv().unwrap();
    // The inline READ is held in the store; it counts in the task set.
    assert_eq!(t.task_set_len(&a, l0()), 1);
    let (t2, b2) = (t.clone(), b.clone());
    let h2 = std::thread::spawn(move || {
        t2.submit_attr(
            &b2,
            l0(),
            2,
            TaskAttr::Ordered,
            &write10(5),
            &[0xab; 512],
            512,
        )
    });
    wait_entered(&t, &a, 2);
    // HEAD OF QUEUE passes; the ORDERED write still waits.
    let r = t.submit_attr(&b, l0(), 3, TaskAttr::HeadOfQueue, &[0; 6], &[], 0);
    assert_eq!(r.status, Status::Good);
    assert!(!h2.is_finished());
    g.open();
    // The READ read what was there before the ORDERED write.
    assert_eq!(good(&h1.join().unwrap()), &[0u8; 512][..]);
    assert_eq!(h2.join().unwrap().status, Status::Good);
    assert_eq!(t.task_set_len(&a, l0()), 0);
    assert_eq!(ok(&t, &a, &read10(5), &[], 512), vec![0xab; 512]);
}

#[test]
fn a_full_task_set_counts_inline_tasks_for_their_nexus() {
    let (t, g, rx, a, b) = held(1);
    let h1 = spawn_routed_read(&t, &a, 1);
    rx.recv().unwrap();
    // The set (depth 1) is full with a's inline READ: TASK SET FULL to
    // a, BUSY to b, which has nothing there (SAM-5 5.3.1).
    let r = t.submit(&a, l0(), 2, &[0; 6], &[], 0);
    assert_eq!(r.status, Status::TaskSetFull);
    let r = t.submit(&b, l0(), 2, &[0; 6], &[], 0);
    assert_eq!(r.status, Status::Busy);
    g.open();
    good(&h1.join().unwrap());
    assert_eq!(t.submit(&b, l0(), 2, &[0; 6], &[], 0).status, Status::Good);
}

#[test]
fn task_management_finds_an_inline_task_ended() {
    let (t, g, rx, a, _) = held(8);
    let h1 = spawn_routed_read(&t, &a, 1);
    rx.recv().unwrap();
    // Not registered: the abort finds nothing to mark, as if it came just
    // after the READ ended, and the READ completes normally.
    assert_eq!(
        t.task_management(&a, l0(), Tmf::AbortTask(7)),
        TmfResponse::FunctionComplete
    );
    g.open();
    good(&h1.join().unwrap());
}

#[test]
fn a_unit_runs_without_blocking_only_while_its_tasks_are_simple() {
    let (t, g, rx, a, b) = held(8);
    assert!(t.runs_without_blocking(&a, l0()));
    let h1 = spawn_routed_read(&t, &a, 1);
    rx.recv().unwrap();
    // An inline SIMPLE task running: others may still run at once.
    assert!(t.runs_without_blocking(&a, l0()));
    let (t2, b2) = (t.clone(), b.clone());
    let h2 = std::thread::spawn(move || {
        t2.submit_attr(&b2, l0(), 2, TaskAttr::Ordered, &[0; 6], &[], 0)
    });
    wait_entered(&t, &a, 2);
    // An ORDERED task waits in the set: a new SIMPLE one would wait too.
    assert!(!t.runs_without_blocking(&a, l0()));
    g.open();
    good(&h1.join().unwrap());
    assert_eq!(h2.join().unwrap().status, Status::Good);
    assert!(t.runs_without_blocking(&a, l0()));
}

#[test]
fn an_inline_check_condition_with_naca_establishes_aca() {
    let config = DeviceConfig {
        norm_aca: true,
        ..DeviceConfig::default()
    };
    let (t, n) = target(Device::new(config, Arc::new(Ram::new(8 * 512))).unwrap());
    let mut route = Route::default();
    good(&routed(&t, &n, &mut route, l0(), &read10(0), &[]));
    // READ(10) past the end, NACA=1 in its CONTROL byte: CHECK CONDITION
    // on the inline path, and the nexus's ACA condition with it.
    let mut past = read10(8);
    past[9] = 0x04;
    let r = routed(&t, &n, &mut route, l0(), &past, &[]);
    assert_eq!(r.sense.expect("sense").asc, Asc::LBA_OUT_OF_RANGE);
    assert_eq!(t.aca_faulted(&n, l0()), Some(n.clone()));
    // While it lasts, the nexus's next READ ends ACA ACTIVE.
    let r = routed(&t, &n, &mut route, l0(), &read10(0), &[]);
    assert_eq!(r.status, Status::AcaActive);
}

/// A READ or WRITE through a route meets a reservation taken after the
/// route was made, and runs again once it is released: the route's plain
/// path checks reservations without the lock only while there are none.
#[test]
fn a_reservation_taken_after_the_route_was_made_conflicts() {
    let (t, a) = target(Device::new(DeviceConfig::default(), Arc::new(Ram::new(8 * 512))).unwrap());
    let b = Nexus::new("b", "p");
    t.execute(&b, l0(), &[0; 6], &[], 0);
    let mut route = Route::default();
    good(&routed(&t, &b, &mut route, l0(), &write10(1), &[5; 512]));
    // REGISTER, then RESERVE Write Exclusive (type 1) from `a`.
    assert_eq!(pr_out(&t, &a, 0, 0, 0, 0x11), Status::Good);
    assert_eq!(pr_out(&t, &a, 1, 1, 0x11, 0), Status::Good);
    let r = routed(&t, &b, &mut route, l0(), &write10(1), &[6; 512]);
    assert_eq!(r.status, Status::ReservationConflict);
    // Write Exclusive lets others read.
    assert_eq!(
        good(&routed(&t, &b, &mut route, l0(), &read10(1), &[])),
        &[5; 512][..]
    );
    // RELEASE: the WRITE runs again.
    assert_eq!(pr_out(&t, &a, 2, 1, 0x11, 0), Status::Good);
    good(&routed(&t, &b, &mut route, l0(), &write10(1), &[6; 512]));
    assert_eq!(
        good(&routed(&t, &b, &mut route, l0(), &read10(1), &[])),
        &[6; 512][..]
    );
}
