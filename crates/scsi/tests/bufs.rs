//! A command's data in the transport's own buffers
//! (`Target::submit_attr_into` with `Buffers`).

mod common;

use common::{l0, target, TempDir};
use scsi::*;
use std::io;
use std::sync::{Arc, Mutex};

/// A ram store that records the address and length of every buffer its
/// `read` was handed.
struct Recording {
    ram: Ram,
    reads: Mutex<Vec<(usize, usize)>>,
    writes: Mutex<Vec<(usize, usize)>>,
}

impl Backend for Recording {
    fn size(&self) -> u64 {
        self.ram.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.reads
            .lock()
            .unwrap()
            .push((buf.as_ptr() as usize, buf.len()));
        self.ram.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        self.writes
            .lock()
            .unwrap()
            .push((data.as_ptr() as usize, data.len()));
        self.ram.write(offset, data, fua)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
}

fn recording(blocks: u64) -> Arc<Recording> {
    Arc::new(Recording {
        ram: Ram::new(blocks * 512),
        reads: Mutex::new(Vec::new()),
        writes: Mutex::new(Vec::new()),
    })
}

fn write16(lba: u64, blocks: u32) -> Vec<u8> {
    let mut c = read16(lba, blocks);
    c[0] = 0x8a;
    c
}

fn read16(lba: u64, blocks: u32) -> Vec<u8> {
    let mut c = vec![0x88, 0];
    c.extend_from_slice(&lba.to_be_bytes());
    c.extend_from_slice(&blocks.to_be_bytes());
    c.extend_from_slice(&[0, 0]);
    c
}

/// Every 512-byte block holds its LBA in each 8-byte word.
fn stamp(store: &dyn Backend, blocks: u64) {
    for lba in 0..blocks {
        let b: Vec<u8> = (0..64).flat_map(|_| lba.to_be_bytes()).collect();
        store.write(lba * 512, &b, false).unwrap();
    }
}

fn lba_of(block: &[u8]) -> u64 {
    u64::from_be_bytes(block[..8].try_into().unwrap())
}

fn config() -> DeviceConfig {
    DeviceConfig::default()
}

/// Runs `cdb` on LUN 0 as a simple task, its data in `bufs`.
fn submit(
    t: &Target,
    n: &Nexus,
    tag: u64,
    cdb: &[u8],
    expected: u64,
    bufs: &mut Buffers<'_, '_>,
) -> ScsiResponse {
    t.submit_attr_into(
        n,
        l0(),
        tag,
        TaskAttr::Simple,
        cdb,
        &[],
        expected,
        Some(bufs),
    )
}

/// `r`, insisting it is GOOD (the sense in words if not).
fn good(r: ScsiResponse) -> ScsiResponse {
    assert_eq!(
        r.status,
        Status::Good,
        "{:?}",
        r.sense.as_ref().map(|s| s.to_string())
    );
    r
}

#[test]
fn a_read_lands_in_the_pieces_with_no_copy_in_between() {
    let rec = recording(256);
    stamp(&*rec, 256);
    let (t, n) = target(Device::new(config(), rec.clone()).unwrap());
    rec.reads.lock().unwrap().clear();
    // Three pieces of odd sizes (a transport's chunks need not be blocks).
    let (mut a, mut b, mut c) = (vec![0u8; 1000], vec![0u8; 3000], vec![0u8; 8192]);
    let want = [
        (a.as_ptr() as usize, 1000),
        (b.as_ptr() as usize, 3000),
        (c.as_ptr() as usize, 16 * 512 - 4000),
    ];
    let mut pieces: Vec<&mut [u8]> = vec![&mut a, &mut b, &mut c];
    let mut sink = Buffers::data_in(&mut pieces);
    let r = good(submit(&t, &n, 1, &read16(100, 16), 16 * 512, &mut sink));
    assert!(r.data_in.is_empty(), "data-in went to the pieces");
    assert_eq!(sink.placed(), 16 * 512);
    assert!(sink.read_direct());
    assert_eq!(r.residual, Residual::None);
    // The store was handed exactly the pieces: no vector in between.
    assert_eq!(*rec.reads.lock().unwrap(), want);
    let all: Vec<u8> = [&a[..], &b[..], &c[..16 * 512 - 4000]].concat();
    for (k, block) in all.chunks(512).enumerate() {
        assert_eq!(lba_of(block), 100 + k as u64, "block {k}");
    }
    assert!(
        c[16 * 512 - 4000..].iter().all(|&x| x == 0),
        "past the data untouched"
    );
}

#[test]
fn pieces_shorter_than_the_transfer_take_what_fits_and_count_the_residual() {
    let (t, n) = target(Device::new(config(), Arc::new(Ram::new(64 * 512))).unwrap());
    let mut buf = vec![0u8; 1024];
    let mut pieces: Vec<&mut [u8]> = vec![&mut buf];
    let mut sink = Buffers::data_in(&mut pieces);
    // Initiator expects 1024 of the 4096 bytes READ(16) moves.
    let r = good(submit(&t, &n, 2, &read16(0, 8), 1024, &mut sink));
    assert_eq!(sink.placed(), 1024);
    assert_eq!(r.residual, Residual::Over(3072));
}

#[test]
fn other_commands_are_copied_into_the_pieces_and_errors_place_nothing() {
    let (t, n) = target(Device::new(config(), Arc::new(Ram::new(64 * 512))).unwrap());
    let inquiry = [0x12, 0, 0, 0, 96, 0];
    let plain = t.execute(&n, l0(), &inquiry, &[], 96).data_in;
    let (mut x, mut y) = (vec![0u8; 10], vec![0u8; 200]);
    let mut pieces: Vec<&mut [u8]> = vec![&mut x, &mut y];
    let mut sink = Buffers::data_in(&mut pieces);
    let r = good(submit(&t, &n, 3, &inquiry, 96, &mut sink));
    assert!(r.data_in.is_empty());
    assert_eq!(sink.placed(), plain.len());
    assert!(!sink.read_direct(), "INQUIRY data is built, then copied");
    assert_eq!([&x[..], &y[..plain.len() - 10]].concat(), plain);

    // LBA out of range: CHECK CONDITION and nothing placed.
    let mut z = vec![0u8; 512];
    let mut pieces: Vec<&mut [u8]> = vec![&mut z];
    let mut sink = Buffers::data_in(&mut pieces);
    let r = submit(&t, &n, 4, &read16(64, 1), 512, &mut sink);
    assert_eq!(r.status, Status::CheckCondition);
    assert_eq!(r.sense.unwrap().asc, Asc::LBA_OUT_OF_RANGE);
    assert_eq!(sink.placed(), 0);
}

#[test]
fn fileio_reads_into_the_pieces_too() {
    let dir = TempDir::new("datain-fileio");
    let file = dir.open("img");
    file.set_len(64 * 512).unwrap();
    let fio = Arc::new(FileIo::new(file, false).unwrap());
    stamp(&*fio, 64);
    let (t, n) = target(Device::new(config(), fio).unwrap());
    let (mut a, mut b) = (vec![0u8; 700], vec![0u8; 4 * 512 - 700]);
    let mut pieces: Vec<&mut [u8]> = vec![&mut a, &mut b];
    let mut sink = Buffers::data_in(&mut pieces);
    good(submit(&t, &n, 5, &read16(60, 4), 4 * 512, &mut sink));
    assert!(sink.read_direct());
    let all = [&a[..], &b[..]].concat();
    for (k, block) in all.chunks(512).enumerate() {
        assert_eq!(lba_of(block), 60 + k as u64);
    }
}

#[test]
fn a_write_is_written_from_the_pieces_with_no_copy_in_between() {
    let rec = recording(64);
    let (t, n) = target(Device::new(config(), rec.clone()).unwrap());
    // 8 blocks in three pieces: the store is handed each piece itself.
    let data: Vec<u8> = (0..8u64)
        .flat_map(|lba| (0..64).flat_map(move |_| (20 + lba).to_be_bytes()))
        .collect();
    let (a, rest) = data.split_at(700);
    let (b, c) = rest.split_at(2000);
    let pieces: Vec<&[u8]> = vec![a, b, c];
    let mut bufs = Buffers::data_out(&pieces);
    let r = good(submit(&t, &n, 6, &write16(20, 8), 8 * 512, &mut bufs));
    assert_eq!(r.residual, Residual::None);
    let handed = rec.writes.lock().unwrap().clone();
    let want: Vec<(usize, usize)> = pieces
        .iter()
        .map(|p| (p.as_ptr() as usize, p.len()))
        .collect();
    assert_eq!(handed, want, "the store got the transport's pieces");
    let back = common::ok(&t, &n, &read16(20, 8), &[], 8 * 512);
    assert_eq!(back, data);
}

#[test]
fn ram_takes_pieces_under_one_lock_and_short_pieces_are_refused() {
    let (t, n) = target(Device::new(config(), Arc::new(Ram::new(64 * 512))).unwrap());
    let data: Vec<u8> = (0..4 * 512).map(|i| (i % 251) as u8).collect();
    let pieces: Vec<&[u8]> = data.chunks(300).collect();
    let mut bufs = Buffers::data_out(&pieces);
    good(submit(&t, &n, 7, &write16(3, 4), 4 * 512, &mut bufs));
    assert_eq!(common::ok(&t, &n, &read16(3, 4), &[], 4 * 512), data);
    // Pieces holding less than the WRITE moves: refused, nothing written.
    let before = common::ok(&t, &n, &read16(10, 4), &[], 4 * 512);
    let pieces: Vec<&[u8]> = vec![&data[..1000], &data[1000..1500]];
    let mut bufs = Buffers::data_out(&pieces);
    let r = submit(&t, &n, 8, &write16(10, 4), 4 * 512, &mut bufs);
    assert_eq!(r.status, Status::CheckCondition);
    assert_eq!(r.sense.unwrap().key, SenseKey::AbortedCommand);
    assert_eq!(common::ok(&t, &n, &read16(10, 4), &[], 4 * 512), before);
}

#[test]
fn commands_that_parse_their_data_out_get_it_gathered() {
    let (t, n) = target(Device::new(config(), Arc::new(Ram::new(64 * 512))).unwrap());
    let block: Vec<u8> = vec![0xab; 512];
    common::ok(&t, &n, &write16(5, 1), &block, 512);
    // COMPARE AND WRITE: compare half and write half, split across pieces
    // at an odd place.
    let mut both = block.clone();
    both.extend(vec![0xcd; 512]);
    let pieces: Vec<&[u8]> = vec![&both[..333], &both[333..]];
    let mut bufs = Buffers::data_out(&pieces);
    let caw = [0x89, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 1, 0, 0];
    good(submit(&t, &n, 9, &caw, 1024, &mut bufs));
    assert_eq!(common::ok(&t, &n, &read16(5, 1), &[], 512), vec![0xcd; 512]);
}
