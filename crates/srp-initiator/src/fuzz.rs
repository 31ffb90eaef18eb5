//! Bodies of the fuzz targets, shared with deterministic tests so CI runs
//! them without a nightly toolchain.

use crate::login::LoginOptions;
use crate::rules::Rules;

/// A login string never panics the parser; what parses prints back to a
/// string that parses to the same options.
pub fn login_string(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(o) = LoginOptions::parse(text) {
        let again = LoginOptions::parse(&o.to_login_string()).expect("canonical form parses");
        assert_eq!(again, o, "canonical form round-trips");
    }
}

/// A rules file never panics the parser.
pub fn rules_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = Rules::parse(text);
}

/// What a target answers and the initiator reads, from arbitrary bytes:
/// a device identification VPD page (its NAA designator and the target
/// port's designators), sense data (is it an ALUA refusal?) and REPORT
/// TARGET PORT GROUPS data. None of it panics; what is read lies inside
/// the data.
pub fn target_answers(data: &[u8]) {
    let _ = crate::disk::naa_of(data);
    let _ = crate::disk::port_designators(data);
    if let Some(r) = crate::disk::AluaRefusal::of_sense("fuzz", data) {
        assert!(!r.state.is_active(), "{r}");
    }
    if let Ok((groups, _)) = scsi::alua::parse_report(data) {
        let used: usize = groups.iter().map(|g| 8 + 4 * g.ports.len()).sum();
        assert!(used <= data.len());
    }
}

#[cfg(test)]
mod tests {
    /// Mutates valid seeds byte by byte (deterministically) and feeds them in.
    fn mutations(seeds: &[&str], mut f: impl FnMut(&[u8])) -> usize {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut n = 0;
        for seed in seeds {
            for _ in 0..2000 {
                let mut b = seed.as_bytes().to_vec();
                for _ in 0..1 + (x % 4) {
                    x = x
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1442695040888963407);
                    let pos = (x >> 33) as usize % (b.len() + 1);
                    let byte = b",=:[]0fxa d#\n"[(x >> 20) as usize % 13];
                    match (x >> 60) % 3 {
                        0 if pos < b.len() => b[pos] = byte,
                        1 => b.insert(pos, byte),
                        _ if pos < b.len() => {
                            b.remove(pos);
                        }
                        _ => {}
                    }
                }
                f(&b);
                n += 1;
            }
        }
        n
    }

    #[test]
    fn login_strings_survive_mutation() {
        let seeds = [
            "id_ext=0002c90300a34270,ioc_guid=0002c90300a34270,dest=192.168.5.1:5000",
            "id_ext=1,ioc_guid=2,dgid=fe800000000000000002c903000f1367,pkey=ffff,service_id=3,max_sect=8192",
            "id_ext=1,ioc_guid=2,dest=[fd00::5]:5555,queue_size=128,cmd_sg_entries=255,allow_ext_sg=1",
        ];
        assert_eq!(mutations(&seeds, super::login_string), 6000);
    }

    #[test]
    fn rules_files_survive_mutation() {
        let seeds = ["d dgid=fe800000000000000002c90200402bd5\na ioc_guid=00a0b80200402bd7\na queue_size=128\nd\n"];
        assert_eq!(mutations(&seeds, super::rules_file), 2000);
    }

    #[test]
    fn target_answers_survive_mutation() {
        // VPD 0x83 as srptd sends it; REPORT TARGET PORT GROUPS data
        // (extended header); NOT READY 04/0B fixed sense.
        let vpd: &[u8] = &[
            0, 0x83, 0, 0x1c, 1, 3, 0, 8, 0x50, 1, 2, 3, 4, 5, 6, 7, 1, 0x14, 0, 4, 0, 0, 0, 2, 1,
            0x15, 0, 4, 0, 0, 0, 2,
        ];
        let rtpg: &[u8] = &[
            0, 0, 0, 28, 0x10, 7, 0, 0, 0x80, 0x8f, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 2, 0x8f, 0, 2, 0,
            0, 0, 1, 0, 0, 0, 2,
        ];
        let sense: &[u8] = &[0x70, 0, 2, 0, 0, 0, 0, 10, 0, 0, 0, 0, 4, 0x0b, 0, 0, 0, 0];
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut n = 0;
        for seed in [vpd, rtpg, sense] {
            for _ in 0..2000 {
                let mut b = seed.to_vec();
                for _ in 0..1 + (x % 4) {
                    x = x
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    let pos = (x >> 33) as usize % (b.len() + 1);
                    match (x >> 60) % 3 {
                        0 if pos < b.len() => b[pos] = (x >> 20) as u8,
                        1 => b.insert(pos, (x >> 20) as u8),
                        _ if pos < b.len() => b.truncate(pos),
                        _ => {}
                    }
                }
                super::target_answers(&b);
                n += 1;
            }
        }
        assert_eq!(n, 6000);
    }

    /// The `target_answers` target's committed seeds and regression inputs.
    #[test]
    fn target_answers_replays_its_committed_inputs() {
        rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "target_answers", |data| {
            super::target_answers(data);
        });
    }

    /// The `login_string` target's committed seeds and regression inputs
    /// (`fuzz/seeds/login_string`, `fuzz/regressions/login_string`).
    #[test]
    fn login_string_replays_its_committed_inputs() {
        rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "login_string", |data| {
            super::login_string(data);
        });
    }

    /// The `rules_file` target's committed seeds and regression inputs
    /// (`fuzz/seeds/rules_file`, `fuzz/regressions/rules_file`).
    #[test]
    fn rules_file_replays_its_committed_inputs() {
        rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "rules_file", |data| {
            super::rules_file(data);
        });
    }
}
