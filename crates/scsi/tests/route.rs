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
    let r = t.submit_routed(
        &route,
        &n,
        l0(),
        1,
        TaskAttr::Simple,
        &read10(0),
        &[],
        512,
        None,
    );
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
    let r = t.submit_routed(
        &route,
        &n,
        l0(),
        1,
        TaskAttr::Simple,
        &read10(2),
        &[],
        512,
        None,
    );
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
    let r = t.submit_routed(
        &route,
        &n,
        l0(),
        1,
        TaskAttr::Simple,
        &read10(2),
        &[],
        512,
        None,
    );
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
    let r = t.submit_routed(
        &route,
        &n,
        l0(),
        1,
        TaskAttr::Simple,
        &read10(3),
        &[],
        512,
        None,
    );
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
    let r = t.submit_routed(
        &route,
        &n,
        l0(),
        1,
        TaskAttr::Simple,
        &read10(0),
        &[],
        512,
        None,
    );
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
