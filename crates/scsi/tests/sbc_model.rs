//! WRITE SAME, UNMAP, COMPARE AND WRITE, REPORT SUPPORTED OPERATION CODES,
//! and a model check: random interleavings of WRITE, WRITE SAME, UNMAP,
//! COMPARE AND WRITE and READ agree with a plain in-memory model on the ram,
//! fileio and blockio (O_DIRECT) backends (deterministic xorshift; proptest is not vendored).

mod common;

use common::l0;

use scsi::*;
use std::sync::Arc;

const BS: usize = 512;
const BLOCKS: u64 = 32;

fn thin(backend: Arc<dyn Backend>) -> Arc<Device> {
    let cfg = DeviceConfig {
        thin: true,
        ..Default::default()
    };
    Arc::new(Device::new(cfg, backend).unwrap())
}

fn target_with(dev: Arc<Device>) -> (Target, Nexus) {
    let t = Target::new();
    let lun = Lun::new(0).unwrap();
    t.add_lun(None, lun, dev);
    let n = Nexus::new("i", "p");
    t.execute(&n, lun, &[0; 6], &[], 0);
    (t, n)
}

fn cdb16(op: u8, flags: u8, lba: u64, n: u32) -> Vec<u8> {
    let mut c = vec![op, flags];
    c.extend_from_slice(&lba.to_be_bytes());
    c.extend_from_slice(&n.to_be_bytes());
    c.extend_from_slice(&[0, 0]);
    c
}

fn caw(lba: u64, n: u8) -> Vec<u8> {
    let mut c = vec![0x89, 0];
    c.extend_from_slice(&lba.to_be_bytes());
    c.extend_from_slice(&[0, 0, 0, n, 0, 0]);
    c
}

fn unmap_params(ranges: &[(u64, u32)]) -> Vec<u8> {
    let mut p = vec![0u8; 8];
    for &(lba, n) in ranges {
        p.extend_from_slice(&lba.to_be_bytes());
        p.extend_from_slice(&n.to_be_bytes());
        p.extend_from_slice(&[0; 4]);
    }
    let d = (p.len() - 8) as u16;
    p[0..2].copy_from_slice(&(d + 6).to_be_bytes());
    p[2..4].copy_from_slice(&d.to_be_bytes());
    p
}

fn unmap_cdb(len: usize) -> Vec<u8> {
    let l = (len as u16).to_be_bytes();
    vec![0x42, 0, 0, 0, 0, 0, 0, l[0], l[1], 0]
}

fn read(t: &Target, n: &Nexus, lba: u64, blocks: u32) -> Vec<u8> {
    let r = t.execute(
        n,
        l0(),
        &cdb16(0x88, 0, lba, blocks),
        &[],
        blocks as u64 * BS as u64,
    );
    assert_eq!(r.status, Status::Good);
    r.data_in
}

#[test]
fn write_same_unmap_caw() {
    let (t, n) = target_with(thin(Arc::new(Ram::new(BLOCKS * BS as u64))));
    let block: Vec<u8> = (0..BS).map(|i| (i * 7) as u8).collect();
    // WRITE SAME(10) over 3 blocks.
    let r = t.execute(&n, l0(), &[0x41, 0, 0, 0, 0, 4, 0, 0, 3, 0], &block, 512);
    assert_eq!(r.status, Status::Good);
    let d = read(&t, &n, 3, 5);
    assert!(d[..BS].iter().all(|&b| b == 0));
    for i in 1..4 {
        assert_eq!(&d[i * BS..(i + 1) * BS], &block[..]);
    }
    // WRITE SAME(16) with UNMAP and zero data; then UNMAP one block.
    let r = t.execute(&n, l0(), &cdb16(0x93, 0x08, 4, 1), &[0; BS], 512);
    assert_eq!(r.status, Status::Good);
    let p = unmap_params(&[(5, 1)]);
    assert_eq!(
        t.execute(&n, l0(), &unmap_cdb(p.len()), &p, p.len() as u64)
            .status,
        Status::Good
    );
    let d = read(&t, &n, 4, 3);
    assert!(d[..2 * BS].iter().all(|&b| b == 0));
    assert_eq!(&d[2 * BS..], &block[..]);
    // UNMAP out of range changes nothing (all descriptors checked first).
    let p = unmap_params(&[(6, 1), (31, 2)]);
    let r = t.execute(&n, l0(), &unmap_cdb(p.len()), &p, p.len() as u64);
    assert_eq!(r.sense.unwrap().asc, Asc::LBA_OUT_OF_RANGE);
    assert_eq!(read(&t, &n, 6, 1), block);
    // Truncated parameter list.
    let r = t.execute(&n, l0(), &unmap_cdb(4), &p[..4], 4);
    assert_eq!(r.sense.unwrap().asc, Asc::PARAMETER_LIST_LENGTH_ERROR);
    // COMPARE AND WRITE: match writes, miscompare reports the offset.
    let mut data = block.clone();
    data.extend_from_slice(&[0x55; BS]);
    assert_eq!(
        t.execute(&n, l0(), &caw(6, 1), &data, 1024).status,
        Status::Good
    );
    assert_eq!(read(&t, &n, 6, 1), vec![0x55; BS]);
    let mut data = vec![0x55; BS];
    data[100] = 0;
    data.extend_from_slice(&[0x66; BS]);
    let r = t.execute(&n, l0(), &caw(6, 1), &data, 1024);
    let s = r.sense.unwrap();
    assert_eq!(
        (s.key, s.asc, s.information),
        (
            SenseKey::Miscompare,
            Asc::MISCOMPARE_DURING_VERIFY,
            Some(100)
        )
    );
    assert_eq!(read(&t, &n, 6, 1), vec![0x55; BS]);
}

#[test]
fn unmap_refused_without_thin_provisioning() {
    let dev =
        Arc::new(Device::new(DeviceConfig::default(), Arc::new(Ram::new(BLOCKS * 512))).unwrap());
    let (t, n) = target_with(dev);
    let p = unmap_params(&[(0, 1)]);
    let r = t.execute(&n, l0(), &unmap_cdb(p.len()), &p, p.len() as u64);
    assert_eq!(r.sense.unwrap().asc, Asc::INVALID_COMMAND_OPERATION_CODE);
    let r = t.execute(&n, l0(), &cdb16(0x93, 0x08, 0, 1), &[0; BS], 512);
    assert_eq!(r.sense.unwrap().field.unwrap().byte, 1);
    let r = t.execute(&n, l0(), &[0x12, 1, 0xb2, 0, 8, 0], &[], 8);
    assert_eq!(r.data_in, [0, 0xb2, 0, 4, 0, 0, 0, 0]);
}

#[test]
fn report_supported_opcodes_matches_table() {
    let (t, n) = target_with(thin(Arc::new(Ram::new(BLOCKS * 512))));
    let r = t.execute(
        &n,
        l0(),
        &[0xa3, 0x0c, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0],
        &[],
        4096,
    );
    assert_eq!(r.status, Status::Good);
    let d = &r.data_in;
    let len = u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize;
    assert_eq!(len + 4, d.len());
    let mut seen = Vec::new();
    for e in d[4..].chunks(8) {
        let op = Opcode::from(e[0]);
        let cdb_len = u16::from_be_bytes([e[6], e[7]]) as usize;
        assert_eq!(Some(cdb_len), op.cdb_len());
        // Each reported command parses (possibly refusing a field) and is
        // never INVALID COMMAND OPERATION CODE.
        let mut cdb = vec![0u8; cdb_len];
        cdb[0] = e[0];
        cdb[1] = e[3];
        if let Err(s) = Command::parse(&cdb) {
            assert_ne!(s.asc, Asc::INVALID_COMMAND_OPERATION_CODE, "{op}");
        }
        seen.push(op);
    }
    seen.dedup();
    // Every opcode of the table but READ(32)/WRITE(32), which only a type
    // 2 PI unit accepts; it lists them too.
    let all_but_32: Vec<Opcode> = Opcode::ALL
        .iter()
        .copied()
        .filter(|&o| o != Opcode::VariableLength)
        .collect();
    assert_eq!(seen, all_but_32);
    let cfg = DeviceConfig {
        protection: Some(PiType::Type2),
        ..Default::default()
    };
    let type2 = Device::new(cfg, Arc::new(Ram::with_pi(BLOCKS * 512, 512))).unwrap();
    let (t2, n2) = target_with(Arc::new(type2));
    let r = t2.execute(
        &n2,
        l0(),
        &[0xa3, 0x0c, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0],
        &[],
        4096,
    );
    let sas: Vec<(u8, u16)> = r.data_in[4..]
        .chunks(8)
        .filter(|e| e[0] == 0x7f)
        .map(|e| (e[5], u16::from_be_bytes([e[6], e[7]])))
        .collect();
    assert_eq!(sas, [(1, 32), (1, 32)]); // SERVACTV, CDB length 32
    assert_eq!(r.data_in.len(), d.len() + 16);
    // One command: READ(10) supported, 0xc0 not.
    let r = t.execute(
        &n,
        l0(),
        &[0xa3, 0x0c, 1, 0x28, 0, 0, 0, 0, 0, 64, 0, 0],
        &[],
        64,
    );
    assert_eq!(&r.data_in[..5], &[0, 3, 0, 10, 0x28]);
    let r = t.execute(
        &n,
        l0(),
        &[0xa3, 0x0c, 1, 0xc0, 0, 0, 0, 0, 0, 64, 0, 0],
        &[],
        64,
    );
    assert_eq!(r.data_in, [0, 1, 0, 0]);
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The PI a block of a type 1 unit should hold: `None` all ones (never
/// written, or unmapped), else the application tag it was written with
/// (the guard and reference tag follow from the data and the LBA).
type PiModel = Vec<Option<u16>>;

fn expect_tuple(model: &[u8], pi: &PiModel, lba: usize) -> [u8; 8] {
    match pi[lba] {
        None => [0xff; 8],
        Some(app) => scsi::pi::Tuple {
            guard: crc16_t10dif(&model[lba * BS..(lba + 1) * BS]),
            app,
            reference: lba as u32,
        }
        .emit(),
    }
}

/// `pi`: the device is formatted with type 1 PI; writes then carry PI
/// half the time (WRPROTECT 1, an application tag of their own) and reads
/// return it half the time (RDPROTECT 1), checked against the model.
fn run_model(dev: Arc<Device>, seed: u64, pi: bool) {
    let (t, n) = target_with(dev);
    let mut model = vec![0u8; BLOCKS as usize * BS];
    let mut pi_model: PiModel = vec![None; BLOCKS as usize];
    let mut rng = Rng(seed);
    for _ in 0..300 {
        let lba = rng.below(BLOCKS + 2);
        let cnt = 1 + rng.below(4) as u32;
        let in_range = lba + cnt as u64 <= BLOCKS;
        let range = lba as usize * BS..(lba as usize + cnt as usize) * BS;
        let blocks = lba as usize..(lba as usize + cnt as usize).min(BLOCKS as usize);
        let fill = rng.next() as u8;
        let with_pi = pi && rng.below(2) == 0;
        let r = match rng.below(5) {
            0 => {
                let data: Vec<u8> = (0..cnt as usize * BS)
                    .map(|i| fill.wrapping_add(i as u8))
                    .collect();
                let app = fill as u16 * 3;
                let out: Vec<u8> = if with_pi {
                    data.chunks(BS)
                        .enumerate()
                        .flat_map(|(k, b)| {
                            let t = scsi::pi::Tuple {
                                guard: crc16_t10dif(b),
                                app,
                                reference: (lba + k as u64) as u32,
                            };
                            b.iter().copied().chain(t.emit())
                        })
                        .collect()
                } else {
                    data.clone()
                };
                let flags = if with_pi { 0x20 } else { 0 };
                let r = t.execute(
                    &n,
                    l0(),
                    &cdb16(0x8a, flags, lba, cnt),
                    &out,
                    out.len() as u64,
                );
                if in_range {
                    model[range].copy_from_slice(&data);
                    for b in blocks {
                        pi_model[b] = Some(if with_pi { app } else { 0 });
                    }
                }
                r
            }
            1 => {
                let r = t.execute(&n, l0(), &cdb16(0x93, 0, lba, cnt), &[fill; BS], 512);
                if in_range {
                    model[range].fill(fill);
                    for b in blocks {
                        pi_model[b] = Some(0);
                    }
                }
                r
            }
            2 => {
                let p = unmap_params(&[(lba, cnt)]);
                let r = t.execute(&n, l0(), &unmap_cdb(p.len()), &p, p.len() as u64);
                if in_range {
                    model[range].fill(0);
                    for b in blocks {
                        pi_model[b] = None;
                    }
                }
                r
            }
            3 => {
                // Compare against the model (sometimes corrupted) then write.
                let mut data = if in_range {
                    model[range.clone()].to_vec()
                } else {
                    vec![0; cnt as usize * BS]
                };
                let corrupt = rng.below(3) == 0;
                if corrupt {
                    data[0] ^= 1;
                }
                data.resize(data.len() + cnt as usize * BS, fill);
                let r = t.execute(&n, l0(), &caw(lba, cnt as u8), &data, data.len() as u64);
                if in_range && !corrupt {
                    model[range].fill(fill);
                    for b in blocks {
                        pi_model[b] = Some(0);
                    }
                } else if in_range {
                    assert_eq!(r.sense.unwrap().key, SenseKey::Miscompare);
                }
                r
            }
            _ => {
                let per = if with_pi { BS + 8 } else { BS };
                let flags = if with_pi { 0x20 } else { 0 };
                let r = t.execute(
                    &n,
                    l0(),
                    &cdb16(0x88, flags, lba, cnt),
                    &[],
                    cnt as u64 * per as u64,
                );
                if in_range && with_pi {
                    for (k, c) in r.data_in.chunks(per).enumerate() {
                        let b = lba as usize + k;
                        assert_eq!(&c[..BS], &model[b * BS..(b + 1) * BS]);
                        assert_eq!(c[BS..], expect_tuple(&model, &pi_model, b), "LBA {b}");
                    }
                    assert_eq!(r.data_in.len(), cnt as usize * per);
                } else if in_range {
                    assert_eq!(r.data_in, model[range]);
                }
                r
            }
        };
        if !in_range {
            assert_eq!(r.sense.unwrap().asc, Asc::LBA_OUT_OF_RANGE);
        }
    }
    assert_eq!(read(&t, &n, 0, BLOCKS as u32), model);
}

#[test]
fn model_agrees_ram_fileio_blockio() {
    for seed in 1..=20u64 {
        run_model(
            thin(Arc::new(Ram::new(BLOCKS * BS as u64))),
            seed * 0x9e37_79b9,
            false,
        );
        let path = std::env::temp_dir().join(format!("scsi-model-{}-{seed}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        f.set_len(BLOCKS * BS as u64).unwrap();
        run_model(
            thin(Arc::new(FileIo::new(f, seed % 2 == 0).unwrap())),
            seed * 0x9e37_79b9,
            false,
        );
        std::fs::remove_file(&path).unwrap();
        // blockio: the same file layout opened O_DIRECT.
        let path =
            std::env::temp_dir().join(format!("scsi-model-bio-{}-{seed}", std::process::id()));
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(BLOCKS * BS as u64).unwrap();
        drop(f);
        run_model(
            thin(Arc::new(BlockIo::open(&path, false, BS).unwrap())),
            seed * 0x9e37_79b9,
            false,
        );
        std::fs::remove_file(&path).unwrap();
    }
}

fn thin_pi(backend: Arc<dyn Backend>) -> Arc<Device> {
    let cfg = DeviceConfig {
        thin: true,
        protection: Some(PiType::Type1),
        ..Default::default()
    };
    Arc::new(Device::new(cfg, backend).unwrap())
}

/// The same model on type 1 PI units (ram, and fileio with its PI side
/// file): data and every block's tuple agree with the model.
#[test]
fn model_agrees_with_pi_ram_fileio() {
    for seed in 1..=8u64 {
        run_model(
            thin_pi(Arc::new(Ram::with_pi(BLOCKS * BS as u64, BS as u32))),
            seed * 0x51_7cc1,
            true,
        );
        let dir = common::TempDir::new(&format!("model-pi-{seed}"));
        let f = dir.open("lun.img");
        f.set_len(BLOCKS * BS as u64).unwrap();
        let store = FileIo::with_pi(f, dir.open("lun.pi"), BS as u32, false).unwrap();
        run_model(thin_pi(Arc::new(store)), seed * 0x51_7cc1, true);
    }
}

/// Concurrent COMPARE AND WRITE increments of one block: each successful
/// CAW replaced exactly the value it compared, so the final counter equals
/// the number of successes (a lost update would make it smaller).
#[test]
fn compare_and_write_is_atomic_under_contention() {
    let (t, n) = target_with(thin(Arc::new(Ram::new(BLOCKS * BS as u64))));
    let t = Arc::new(t);
    let threads: Vec<_> = (0..4)
        .map(|k| {
            let t = t.clone();
            let n = n.clone();
            std::thread::spawn(move || {
                let mut ok = 0u64;
                for _ in 0..200 {
                    let cur = read(&t, &n, 0, 1);
                    let v = u64::from_be_bytes(cur[..8].try_into().unwrap());
                    let mut data = cur.clone();
                    let mut new = vec![0u8; BS];
                    new[..8].copy_from_slice(&(v + 1).to_be_bytes());
                    data.extend_from_slice(&new);
                    if t.execute(&n, l0(), &caw(0, 1), &data, 1024).status == Status::Good {
                        ok += 1;
                    }
                    // Plain writes to a neighbour block contend for the lock.
                    let w = t.execute(&n, l0(), &cdb16(0x8a, 0, 1 + k, 1), &[k as u8; BS], 512);
                    assert_eq!(w.status, Status::Good);
                }
                ok
            })
        })
        .collect();
    let total: u64 = threads.into_iter().map(|h| h.join().unwrap()).sum();
    let fin = read(&t, &n, 0, 1);
    assert_eq!(u64::from_be_bytes(fin[..8].try_into().unwrap()), total);
    assert!(total > 0);
}
