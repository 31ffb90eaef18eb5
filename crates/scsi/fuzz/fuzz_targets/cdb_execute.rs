//! Arbitrary CDBs (and data-out) executed against a ram LUN.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    scsi::fuzz::cdb_execute(data);
});
