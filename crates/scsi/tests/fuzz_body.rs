//! Runs the cargo-fuzz target body over deterministic random and mutated
//! inputs so CI exercises it without nightly.

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[test]
fn cdb_execute_body() {
    let seeds: [&[u8]; 9] = [
        &[10, 0x28, 0, 0, 0, 0, 1, 0, 0, 2, 0],
        &[10, 0x2a, 0x08, 0, 0, 0, 0, 0, 0, 1, 0],
        &[16, 0x89, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0],
        &[10, 0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0],
        &[12, 0xa3, 0x0c, 1, 0x28, 0, 0, 0, 0, 0, 64, 0, 0],
        // Type 1 PI: WRITE(10) WRPROTECT 1, READ(16) RDPROTECT 1.
        &[0x40 | 10, 0x2a, 0x20, 0, 0, 0, 1, 0, 0, 2, 0],
        &[
            0x40 | 16,
            0x88,
            0x20,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            3,
            0,
            0,
            0,
            2,
            0,
            0,
        ],
        // Type 2 PI: WRITE(32) WRPROTECT 1, one block.
        &[
            0x80 | 32,
            0x7f,
            0,
            0,
            0,
            0,
            0,
            0,
            0x18,
            0,
            0x0b,
            0x20,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            4,
            0,
            0,
            0,
            4,
            0x12,
            0x34,
            0xff,
            0xff,
            0,
            0,
            0,
            1,
        ],
        // PR OUT REGISTER AND MOVE (its parameter list is fuzzed too).
        &[10, 0x5f, 7, 0, 0, 0, 0, 0, 0, 48, 0],
    ];
    let mut x = 0x2545_f491_4f6c_dd1d;
    for i in 0..4000 {
        let mut input: Vec<u8> = if i % 3 == 0 {
            (0..xorshift(&mut x) % 64)
                .map(|_| xorshift(&mut x) as u8)
                .collect()
        } else {
            let mut v = seeds[(xorshift(&mut x) % seeds.len() as u64) as usize].to_vec();
            v.extend((0..(xorshift(&mut x) % 1100)).map(|_| xorshift(&mut x) as u8));
            v
        };
        for _ in 0..(xorshift(&mut x) % 4) {
            if !input.is_empty() {
                let k = (xorshift(&mut x) % input.len() as u64) as usize;
                input[k] = xorshift(&mut x) as u8;
            }
        }
        scsi::fuzz::cdb_execute(&input);
    }
}

/// The `cdb_execute` target's committed seeds and regression inputs
/// (`fuzz/seeds/cdb_execute`, `fuzz/regressions/cdb_execute`).
#[test]
fn cdb_execute_replays_its_committed_inputs() {
    rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "cdb_execute", |data| {
        scsi::fuzz::cdb_execute(data);
    });
}

/// The `vcdrom_execute` target on stable: its committed inputs, then
/// sequences of MMC commands, ejects and loads made from them.
#[test]
fn vcdrom_execute_body() {
    rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "vcdrom_execute", |data| {
        scsi::fuzz::vcdrom_execute(data);
    });
    let cmds: [&[u8]; 8] = [
        &[10, 0x28, 0, 0, 0, 0, 6, 0, 0, 2, 0],
        &[12, 0xa8, 0, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0],
        &[16, 0x88, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 1, 0, 0],
        &[10, 0x43, 2, 0, 0, 0, 0, 0, 0, 100, 0],
        &[10, 0x46, 0, 0, 0, 0, 0, 0, 1, 0, 0],
        &[10, 0x4a, 1, 0, 0, 0x10, 0, 0, 0, 8, 0],
        &[6, 0x1e, 0, 0, 0, 1, 0],
        &[6, 0x1b, 0, 0, 0, 2, 0],
    ];
    let mut x = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..1500 {
        let mut input = Vec::new();
        for _ in 0..(1 + xorshift(&mut x) % 6) {
            let mut c = cmds[(xorshift(&mut x) % cmds.len() as u64) as usize].to_vec();
            c[0] |= (xorshift(&mut x) as u8) & 0xe0;
            let k = (xorshift(&mut x) % c.len() as u64) as usize;
            if k > 0 && xorshift(&mut x) % 2 == 0 {
                c[k] = xorshift(&mut x) as u8;
            }
            input.extend_from_slice(&c);
        }
        scsi::fuzz::vcdrom_execute(&input);
    }
}
