//! READs from a memory store (`srp_target::MemStore`, what srptd's `ram`
//! handler uses) go out of the store's own registered memory: verified
//! data, counted as data-in sent with no copy, and the store's
//! registration ends when the store lets the memory go (a resize, the LUN
//! removed) and when the port stops.

mod common;

use common::{connect, fabric};
use rdma_access::resource::{AccessLayer, Kind};
use rdma_types::Guid;
use srp::initiator::ChannelConfig;
use srp::target::TargetConfig;
use srp_initiator::disk::Disk;
use srp_initiator::session::SessionConfig;
use srp_target::{MemStore, PortOptions, TargetPort};
use std::sync::Arc;

const TARGET_GUID: u64 = 0x0002_c903_0000_5111;
const INIT_GUID: u64 = 0x0002_c903_0000_5222;

fn device(store: &Arc<MemStore>) -> Arc<scsi::Device> {
    Arc::new(scsi::Device::new(scsi::DeviceConfig::default(), store.clone()).unwrap())
}

/// Bytes that differ at every offset of a transfer and between transfers.
fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i * 31 + seed * 7 + i / 251) as u8)
        .collect()
}

#[test]
fn reads_go_out_of_the_stores_memory_and_its_registration_ends_with_it() {
    let provider: Arc<dyn verbs::Provider> = fabric(&[TARGET_GUID, INIT_GUID]);
    // The target's verbs objects are counted; the initiator's are not.
    let access = AccessLayer::new(provider.clone());
    let target_side = access.client("srp target").into_provider();
    let chan = ChannelConfig::new(0x51, Guid(INIT_GUID), TARGET_GUID, Guid(TARGET_GUID));
    let store = Arc::new(MemStore::new(8 << 20).unwrap());
    let scsi = Arc::new(scsi::Target::new());
    scsi.add_lun(None, scsi::Lun::new(0).unwrap(), device(&store));
    let port = Arc::new(
        TargetPort::start(
            target_side.clone(),
            Guid(TARGET_GUID),
            TargetConfig::new(chan.target_port_id(), "memory store"),
            scsi.clone(),
            PortOptions::default(),
        )
        .unwrap(),
    );
    let sess = connect(&provider, INIT_GUID, &port, SessionConfig::new(chan));
    let disk = Disk::open(sess.clone(), 0).unwrap();
    // The port's and the channel's own; no READ has come yet.
    let mrs_at_start = access.live(Kind::Mr);

    // 1 MiB written, read back whole and in 4 KiB pieces.
    let data = pattern(1 << 20, 1);
    disk.write(2048, &data).unwrap();
    let sent_before = port.direct_data_in();
    let mut back = vec![0u8; data.len()];
    disk.read(2048, &mut back).unwrap();
    assert!(back == data, "1 MiB read back from the memory store");
    for k in 0..16 {
        let mut piece = vec![0u8; 4096];
        disk.read(2048 + k * 8, &mut piece).unwrap();
        let at = k as usize * 4096;
        assert!(piece == data[at..at + 4096], "4 KiB piece {k}");
    }
    assert!(
        port.direct_data_in() >= sent_before + 17,
        "every READ went out with no copy: {} -> {}",
        sent_before,
        port.direct_data_in()
    );
    assert_eq!(
        access.live(Kind::Mr),
        mrs_at_start + 1,
        "the store is registered once"
    );

    // A resize gives the store new memory: the next READ registers it and
    // lets the old registration go.
    store_resize(&store, 16 << 20);
    disk.read(2048, &mut back).unwrap();
    assert!(back == data, "the data survives the resize");
    assert_eq!(
        access.live(Kind::Mr),
        mrs_at_start + 1,
        "old memory released"
    );
    // 6 MiB at once (up to the end the initiator knows of): a 4 MiB and
    // a 2 MiB command of 96 WRITEs together, more than a quarter of the
    // send queue unsignaled in a row.
    let big = pattern(6 << 20, 3);
    disk.write(4096, &big).unwrap();
    let mut back_big = vec![0u8; big.len()];
    disk.read(4096, &mut back_big).unwrap();
    assert!(back_big == big, "6 MiB read back from the resized store");
    drop(disk);

    // The LUN removed and another one added: the first store's memory is
    // no one's but the registration's, which ends at the next one.
    scsi.remove_lun(None, scsi::Lun::new(0).unwrap());
    drop(store);
    let other = Arc::new(MemStore::new(4 << 20).unwrap());
    scsi.add_lun(None, scsi::Lun::new(1).unwrap(), device(&other));
    let disk = Disk::open(sess.clone(), 1).unwrap();
    let data = pattern(64 << 10, 2);
    disk.write(0, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    disk.read(0, &mut back).unwrap();
    assert!(back == data, "64 KiB read back from the second store");
    assert_eq!(
        access.live(Kind::Mr),
        mrs_at_start + 1,
        "the removed store's registration ended"
    );
    drop(disk);
    drop(sess);

    port.stop();
    assert_eq!(access.live(Kind::Mr), 0, "a stopped port holds no MR");
}

fn store_resize(store: &MemStore, size: u64) {
    scsi::Backend::resize(store, size).unwrap();
}
