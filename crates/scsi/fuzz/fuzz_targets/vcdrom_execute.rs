//! Arbitrary MMC command sequences (with ejects and loads between them)
//! executed against a virtual CD-ROM LUN.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    scsi::fuzz::vcdrom_execute(data);
});
