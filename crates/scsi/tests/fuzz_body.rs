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
    let seeds: [&[u8]; 5] = [
        &[10, 0x28, 0, 0, 0, 0, 1, 0, 0, 2, 0],
        &[10, 0x2a, 0x08, 0, 0, 0, 0, 0, 0, 1, 0],
        &[16, 0x89, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0],
        &[10, 0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0],
        &[12, 0xa3, 0x0c, 1, 0x28, 0, 0, 0, 0, 0, 64, 0, 0],
    ];
    let mut x = 0x2545_f491_4f6c_dd1d;
    for i in 0..4000 {
        let mut input: Vec<u8> = if i % 3 == 0 {
            (0..xorshift(&mut x) % 64)
                .map(|_| xorshift(&mut x) as u8)
                .collect()
        } else {
            let mut v = seeds[(xorshift(&mut x) % 5) as usize].to_vec();
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
