//! The pass-through handler over a fake executor: what reaches the device
//! (CDB, direction and length from the transport), what the core keeps
//! (REPORT LUNS, reservations, unit attentions, identity), and what comes
//! back (the device's sense as it gave it).

mod common;

use common::{l0, target};
use scsi::passthrough::{
    Answer, Data, ExecError, Executor, Identity, DEFAULT_TIMEOUT_MS, LONG_TIMEOUT_MS, MAX_TRANSFER,
};
use scsi::*;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

/// What the fake device was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    cdb: Vec<u8>,
    dir: DataDir,
    len: usize,
    pieces: usize,
    out: Vec<u8>,
}

/// A scripted answer: data-in to send (cut to the transfer), the answer.
type Scripted = Result<(Vec<u8>, Answer), ExecError>;

/// A device that records every command and answers from a script; with
/// the script empty, GOOD with data-in bytes `k as u8`.
#[derive(Default)]
struct Fake {
    calls: Mutex<Vec<Call>>,
    script: Mutex<VecDeque<Scripted>>,
    resets: AtomicUsize,
}

impl Fake {
    fn then(&self, s: Scripted) {
        self.script.lock().unwrap().push_back(s);
    }
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
}

/// CHECK CONDITION with `sense`, nothing moved.
fn check_condition(sense: Vec<u8>) -> Answer {
    Answer {
        status: 2,
        sense,
        resid: 0,
    }
}

fn good() -> Answer {
    Answer {
        status: 0,
        sense: Vec::new(),
        resid: 0,
    }
}

/// The executor the handler owns, sharing the fake with the test.
struct Shared(Arc<Fake>);

impl Executor for Shared {
    fn execute(&self, cdb: &[u8], data: Data<'_, '_>, _t: u32) -> Result<Answer, ExecError> {
        let f = &self.0;
        let (dir, len) = (data.dir(), data.len());
        let (pieces, out) = match &data {
            Data::Out(p) => (p.len(), p.concat()),
            Data::In(p) => (p.len(), Vec::new()),
            Data::None => (0, Vec::new()),
        };
        f.calls.lock().unwrap().push(Call {
            cdb: cdb.to_vec(),
            dir,
            len,
            pieces,
            out,
        });
        let (fill, mut answer) = match f.script.lock().unwrap().pop_front() {
            Some(s) => s?,
            None => ((0..len).map(|k| k as u8).collect(), good()),
        };
        if let Data::In(p) = data {
            // Data-in the device did not send is a residual, as SG_IO says.
            answer.resid = answer.resid.max(len.saturating_sub(fill.len()));
            let mut src = fill.iter();
            for piece in p.iter_mut() {
                for b in piece.iter_mut() {
                    match src.next() {
                        Some(x) => *b = *x,
                        None => break,
                    }
                }
            }
        }
        Ok(answer)
    }

    fn reset_device(&self) -> Result<(), ExecError> {
        self.0.resets.fetch_add(1, SeqCst);
        Ok(())
    }
}

fn passed(identity: Identity, config: DeviceConfig) -> (Arc<Fake>, Device) {
    let fake = Arc::new(Fake::default());
    let h = PassThrough::new(Box::new(Shared(fake.clone())), identity);
    (fake, Device::pass_through(config, h).unwrap())
}

/// A target with a pass-through LUN 0, nexus `a` past its power-on UA.
fn setup() -> (Arc<Fake>, Target, Nexus) {
    let (fake, dev) = passed(Identity::default(), DeviceConfig::default());
    let (t, n) = target(dev);
    (fake, t, n)
}

/// Another nexus, past its power-on UA (REQUEST SENSE: the core's).
fn other(t: &Target, name: &str) -> Nexus {
    let n = Nexus::new(name, "p");
    let r = t.execute(&n, l0(), &[0x03, 0, 0, 0, 18, 0], &[], 18);
    assert_eq!(r.status, Status::Good);
    assert_eq!(r.data_in[12], 0x29, "REQUEST SENSE reports the power-on UA");
    n
}

#[test]
fn direction_and_length_come_from_the_transport_not_an_opcode_table() {
    let (fake, t, n) = setup();
    // A tape's REWIND (01h): no data; the core's opcode table has no 01h.
    let r = t.execute(&n, l0(), &[0x01, 0, 0, 0, 0, 0], &[], 0);
    assert_eq!(r.status, Status::Good);
    // A tape's READ(6) of a 1000-byte variable block (08h, SILI): the
    // transport says 1000 bytes in.
    let r = t.execute(&n, l0(), &[0x08, 0x02, 0, 0x03, 0xe8, 0], &[], 1000);
    assert_eq!(r.status, Status::Good);
    assert_eq!(r.data_in.len(), 1000);
    assert_eq!(r.data_in[999], (999 % 256) as u8);
    // A vendor opcode with 300 bytes out.
    let out: Vec<u8> = (0..300).map(|k| (k * 7) as u8).collect();
    let r = t.execute(&n, l0(), &[0xd5, 0, 0, 0, 0, 0, 0, 0, 0, 0], &out, 300);
    assert_eq!(r.status, Status::Good);
    let calls = fake.calls();
    assert_eq!(calls.len(), 3);
    assert_eq!((calls[0].dir, calls[0].len), (DataDir::None, 0));
    assert_eq!((calls[1].dir, calls[1].len), (DataDir::In, 1000));
    assert_eq!(calls[1].cdb, [0x08, 0x02, 0, 0x03, 0xe8, 0]);
    assert_eq!((calls[2].dir, calls[2].len), (DataDir::Out, 300));
    assert_eq!(calls[2].out, out);
}

#[test]
fn data_moves_between_the_transports_pieces_and_the_device() {
    let (fake, t, n) = setup();
    // Data-in into three pieces, handed to the device as three.
    let (mut a, mut b, mut c) = (vec![0u8; 100], vec![0u8; 50], vec![0u8; 200]);
    let mut pieces: Vec<&mut [u8]> = vec![&mut a, &mut b, &mut c];
    let mut bufs = Buffers::data_in(&mut pieces);
    let cdb = [0x3c, 0x02, 0, 0, 0, 0, 0, 1, 0x5e, 0]; // READ BUFFER
    let r = t.submit_attr_into(
        &n,
        l0(),
        1,
        TaskAttr::Simple,
        &cdb,
        &[],
        350,
        Some(&mut bufs),
    );
    assert_eq!(r.status, Status::Good);
    assert_eq!(bufs.placed(), 350);
    assert!(bufs.read_direct(), "the device wrote into the pieces");
    assert_eq!(c[199], (349 % 256) as u8);
    assert_eq!(b[0], 100);
    // Data-out from two pieces, for a command the core does not parse
    // (WRITE BUFFER): not gathered, the device gets the pieces.
    let (x, y) = (vec![1u8; 64], vec![2u8; 32]);
    let out: Vec<&[u8]> = vec![&x, &y];
    let mut bufs = Buffers::data_out(&out);
    let cdb = [0x3b, 0x02, 0, 0, 0, 0, 0, 0, 96, 0];
    let r = t.submit_attr_into(
        &n,
        l0(),
        2,
        TaskAttr::Simple,
        &cdb,
        &[],
        96,
        Some(&mut bufs),
    );
    assert_eq!(r.status, Status::Good);
    let calls = fake.calls();
    assert_eq!(
        (calls[0].dir, calls[0].len, calls[0].pieces),
        (DataDir::In, 350, 3)
    );
    assert_eq!(
        (calls[1].dir, calls[1].len, calls[1].pieces),
        (DataDir::Out, 96, 2)
    );
    assert_eq!(calls[1].out, [x, y].concat());
}

#[test]
fn short_transfers_are_residuals_and_huge_ones_never_reach_the_device() {
    let (fake, t, n) = setup();
    fake.then(Ok((
        vec![9; 512],
        Answer {
            resid: 3584,
            ..good()
        },
    )));
    let r = t.execute(&n, l0(), &[0x08, 0, 0, 0, 8, 0], &[], 4096);
    assert_eq!(r.status, Status::Good);
    assert_eq!(r.data_in, vec![9; 512]);
    assert_eq!(r.residual, Residual::Under(3584));
    // A resid beyond the transfer (a device answering garbage) is capped.
    fake.then(Ok((
        Vec::new(),
        Answer {
            resid: 1 << 40,
            ..good()
        },
    )));
    let r = t.execute(&n, l0(), &[0x08, 0, 0, 0, 1, 0], &[], 512);
    assert_eq!((r.data_in.len(), r.residual), (0, Residual::Under(512)));
    let calls = fake.calls().len();
    let r = t.execute(
        &n,
        l0(),
        &[0x08, 0, 0, 0, 1, 0],
        &[],
        MAX_TRANSFER as u64 + 1,
    );
    assert_eq!(r.status, Status::CheckCondition);
    assert_eq!(r.sense.unwrap().key, SenseKey::IllegalRequest);
    assert_eq!(fake.calls().len(), calls, "not sent");
}

#[test]
fn the_devices_sense_goes_back_as_it_gave_it() {
    let (fake, t, n) = setup();
    // Descriptor sense: MEDIUM ERROR, 11/00, an information descriptor
    // and a vendor-specific descriptor (type 80h) the core knows nothing of.
    let sense = vec![
        0x72, 0x03, 0x11, 0x00, 0, 0, 0, 0x14, // header, 20 more bytes
        0x00, 0x0a, 0x80, 0, 0, 0, 0, 0, 0, 0, 0x12, 0x34, // information 1234h
        0x80, 0x06, 1, 2, 3, 4, 5, 6, // vendor
    ];
    fake.then(Ok((
        Vec::new(),
        Answer {
            status: 0x02,
            sense: sense.clone(),
            resid: 512,
        },
    )));
    let r = t.execute(&n, l0(), &[0x28, 0, 0, 0, 0x12, 0x34, 0, 0, 1, 0], &[], 512);
    assert_eq!(r.status, Status::CheckCondition);
    assert_eq!(r.sense_bytes().unwrap(), sense);
    let s = r.sense.unwrap();
    assert_eq!(
        (s.key, s.asc),
        (SenseKey::MediumError, Asc::UNRECOVERED_READ_ERROR)
    );
    // A CHECK CONDITION without sense, and a status nobody defines, are
    // the target's HARDWARE ERROR, not an empty sense or a bad status.
    fake.then(Ok((
        Vec::new(),
        Answer {
            status: 0x02,
            ..good()
        },
    )));
    fake.then(Ok((
        Vec::new(),
        Answer {
            status: 0x3e,
            ..good()
        },
    )));
    for _ in 0..2 {
        let r = t.execute(&n, l0(), &[0x00; 6], &[], 0);
        assert_eq!(r.status, Status::CheckCondition);
        let s = r.sense.unwrap();
        assert_eq!(
            (s.key, s.asc),
            (SenseKey::HardwareError, Asc::INTERNAL_TARGET_FAILURE)
        );
        assert_eq!(r.sense_bytes().unwrap()[2] & 0x0f, 0x04);
    }
    // CONDITION MET (a PRE-FETCH) passes as it is.
    fake.then(Ok((
        Vec::new(),
        Answer {
            status: 0x04,
            ..good()
        },
    )));
    let r = t.execute(&n, l0(), &[0x34, 0, 0, 0, 0, 0, 0, 0, 1, 0], &[], 0);
    assert_eq!(r.status, Status::ConditionMet);
}

#[test]
fn report_luns_and_reservations_stay_the_targets() {
    let (fake, t, a) = setup();
    let b = other(&t, "b");
    let r = t.execute(&a, l0(), &[0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0], &[], 16);
    assert_eq!(r.status, Status::Good);
    assert_eq!(&r.data_in[..4], &[0, 0, 0, 8], "one LUN, from the core");
    // a registers and reserves WRITE EXCLUSIVE; none of it reaches the device.
    let pr = |n: &Nexus, sa: u8, ty: u8, key: u64| {
        let mut p = key.to_be_bytes().to_vec();
        if sa == 0 {
            p = [0u64.to_be_bytes(), key.to_be_bytes()].concat();
        }
        p.resize(24, 0);
        t.execute(n, l0(), &[0x5f, sa, ty, 0, 0, 0, 0, 0, 24, 0], &p, 24)
    };
    assert_eq!(pr(&a, 0, 0, 0xaa).status, Status::Good);
    assert_eq!(pr(&a, 1, 0x01, 0xaa).status, Status::Good);
    let r = t.execute(&a, l0(), &[0x5e, 0x01, 0, 0, 0, 0, 0, 0, 24, 0], &[], 24);
    assert_eq!(
        r.data_in[8..16],
        0xaau64.to_be_bytes(),
        "READ RESERVATION: a's key"
    );
    assert_eq!(
        fake.calls(),
        vec![],
        "REPORT LUNS and PR never reach the device"
    );
    // b: a WRITE(10), a tape's REWIND and an unknown data-out command
    // conflict; its READ(10) and INQUIRY run (write exclusive).
    let w10 = [0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    assert_eq!(
        t.execute(&b, l0(), &w10, &[0; 512], 512).status,
        Status::ReservationConflict
    );
    assert_eq!(
        t.execute(&b, l0(), &[0x01, 0, 0, 0, 0, 0], &[], 0).status,
        Status::ReservationConflict
    );
    let vendor_out = [0xd5, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(
        t.execute(&b, l0(), &vendor_out, &[1; 8], 8).status,
        Status::ReservationConflict
    );
    assert_eq!(fake.calls(), vec![]);
    let r10 = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    assert_eq!(t.execute(&b, l0(), &r10, &[], 512).status, Status::Good);
    assert_eq!(
        t.execute(&b, l0(), &[0x12, 0, 0, 0, 36, 0], &[], 36).status,
        Status::Good
    );
    // The holder's write goes to the device.
    assert_eq!(
        t.execute(&a, l0(), &w10, &[0; 512], 512).status,
        Status::Good
    );
    let sent: Vec<u8> = fake.calls().iter().map(|c| c.cdb[0]).collect();
    assert_eq!(sent, [0x28, 0x12, 0x2a]);
    // SPC-2 RESERVE(6)/RELEASE(6) are refused, not passed.
    for op in [0x16u8, 0x17, 0x56, 0x57] {
        let r = t.execute(&a, l0(), &[op, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 0);
        assert_eq!(r.sense.unwrap().asc, Asc::INVALID_COMMAND_OPERATION_CODE);
    }
    assert_eq!(fake.calls().len(), 3);
}

#[test]
fn a_device_that_goes_away_ends_the_lun_without_touching_it_again() {
    let (fake, t, n) = setup();
    fake.then(Err(ExecError::Gone("ENODEV".into())));
    let r = t.execute(&n, l0(), &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0], &[], 512);
    assert_eq!(r.status, Status::CheckCondition);
    assert_eq!(r.sense.unwrap().asc, Asc::LOGICAL_UNIT_NOT_SUPPORTED);
    for cdb in [
        vec![0x00; 6],
        vec![0x12, 0, 0, 0, 36, 0],
        vec![0x01, 0, 0, 0, 0, 0],
    ] {
        let r = t.execute(&n, l0(), &cdb, &[], 36);
        assert_eq!(r.sense.unwrap().asc, Asc::LOGICAL_UNIT_NOT_SUPPORTED);
    }
    assert_eq!(fake.calls().len(), 1, "only the command that found it gone");
    let dev = t.device(&n, l0()).unwrap();
    assert!(dev.pass_through_handler().unwrap().is_gone());
    // REPORT LUNS still answers (the core's), and a reset does not try.
    let r = t.execute(&n, l0(), &[0xa0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0], &[], 16);
    assert_eq!(r.status, Status::Good);
    t.tmf(&n, l0(), Tmf::LogicalUnitReset);
    assert_eq!(fake.resets.load(SeqCst), 0);
    // A host without room now (the sg driver's 16 requests per node) is
    // BUSY, nothing moved.
    let (fake, t, n) = setup();
    fake.then(Err(ExecError::Busy(std::io::Error::from_raw_os_error(
        libc_edom(),
    ))));
    let r = t.execute(&n, l0(), &[0x08, 0, 0, 0, 1, 0], &[], 512);
    assert_eq!((r.status, r.residual), (Status::Busy, Residual::Under(512)));
    assert!(r.data_in.is_empty() && r.sense_bytes().is_none());
    // A host failure (timeout, bus reset) is ABORTED COMMAND: retryable.
    let (fake, t, n) = setup();
    fake.then(Err(ExecError::Transport { host: 3, driver: 0 }));
    let r = t.execute(&n, l0(), &[0x00; 6], &[], 0);
    assert_eq!(r.sense.unwrap().key, SenseKey::AbortedCommand);
    assert_eq!(t.execute(&n, l0(), &[0x00; 6], &[], 0).status, Status::Good);
}

#[test]
fn lun_reset_resets_the_device_and_every_nexus_hears_of_it_once() {
    let (fake, t, a) = setup();
    let b = other(&t, "b");
    assert_eq!(
        t.tmf(&a, l0(), Tmf::LogicalUnitReset),
        ServiceResponse::FunctionComplete
    );
    assert_eq!(fake.resets.load(SeqCst), 1);
    for n in [&a, &b] {
        let r = t.execute(n, l0(), &[0x00; 6], &[], 0);
        assert_eq!(r.sense.unwrap().asc, Asc::BUS_DEVICE_RESET, "the core's UA");
    }
    assert_eq!(fake.calls().len(), 0);
    // The device's own report of the reset is not passed on a second time:
    // the command runs again and its answer goes back.
    let ua = Sense::new(SenseKey::UnitAttention, Asc::POWER_ON_RESET).to_fixed();
    fake.then(Ok((Vec::new(), check_condition(ua.clone()))));
    assert_eq!(t.execute(&a, l0(), &[0x00; 6], &[], 0).status, Status::Good);
    assert_eq!(fake.calls().len(), 2);
    // Only once: a later reset UA from the device (someone else reset
    // it) goes back as it came.
    fake.then(Ok((Vec::new(), check_condition(ua.clone()))));
    let r = t.execute(&b, l0(), &[0x00; 6], &[], 0);
    assert_eq!(r.sense_bytes().unwrap(), ua);
}

#[test]
fn a_unit_attention_the_device_reports_reaches_every_nexus() {
    let (fake, t, a) = setup();
    let b = other(&t, "b");
    let ua = Sense::new(SenseKey::UnitAttention, Asc::CAPACITY_DATA_CHANGED).to_fixed();
    fake.then(Ok((Vec::new(), check_condition(ua.clone()))));
    let r = t.execute(&a, l0(), &[0x00; 6], &[], 0);
    assert_eq!(r.sense_bytes().unwrap(), ua);
    // b hears it from the core, without asking the device.
    let r = t.execute(&b, l0(), &[0x00; 6], &[], 0);
    assert_eq!(r.sense.unwrap().asc, Asc::CAPACITY_DATA_CHANGED);
    assert_eq!(fake.calls().len(), 1);
    // a is not told twice.
    assert_eq!(t.execute(&a, l0(), &[0x00; 6], &[], 0).status, Status::Good);
}

/// Standard INQUIRY data of a tape drive (type 01h), 36 bytes, NORMACA set.
fn tape_inquiry() -> Vec<u8> {
    let mut d = vec![0x01, 0x80, 0x06, 0x22, 31, 0, 0, 0x02];
    d.extend_from_slice(b"HP      Ultrium 5-SCSI  Z6ED");
    d
}

#[test]
fn the_configured_identity_is_the_luns() {
    let config = DeviceConfig {
        vendor: "ACME".into(),
        serial: "SN-42".into(),
        ..DeviceConfig::default()
    };
    let identity = Identity {
        vendor: true,
        product: false,
        serial: true,
    };
    let (fake, dev) = passed(identity, config);
    let (t, n) = target(dev);
    fake.then(Ok((tape_inquiry(), good())));
    let d = t
        .execute(&n, l0(), &[0x12, 0, 0, 0, 36, 0], &[], 36)
        .data_in;
    assert_eq!(d[0], 0x01, "still a tape");
    assert_eq!(&d[8..16], b"ACME    ", "vendor configured");
    assert_eq!(&d[16..32], b"Ultrium 5-SCSI  ", "product the device's");
    assert_eq!(d[3] & 0x20, 0, "NORMACA cleared: the target refuses NACA=1");
    // Allocation shorter than the vendor field: patched as far as it goes.
    fake.then(Ok((tape_inquiry(), good())));
    let d = t
        .execute(&n, l0(), &[0x12, 0, 0, 0, 12, 0], &[], 12)
        .data_in;
    assert_eq!(&d[8..12], b"ACME");
    // VPD 80h: the configured serial, the device's peripheral byte (the
    // handler asks the device for its standard data, not for page 80h).
    fake.then(Ok((tape_inquiry(), good())));
    let d = t
        .execute(&n, l0(), &[0x12, 1, 0x80, 0, 255, 0], &[], 255)
        .data_in;
    assert_eq!(&d[..4], &[0x01, 0x80, 0, 5]);
    assert_eq!(&d[4..], b"SN-42");
    // VPD 83h: NAA and T10 designators, and the relative target port.
    fake.then(Ok((tape_inquiry(), good())));
    let d = t
        .execute(&n, l0(), &[0x12, 1, 0x83, 0, 255, 0], &[], 255)
        .data_in;
    assert_eq!(&d[..2], &[0x01, 0x83]);
    assert_eq!(&d[4..8], &[0x01, 0x03, 0x00, 0x08], "NAA");
    assert!(
        d.windows(4).any(|w| w == [0x01, 0x14, 0x00, 0x04]),
        "relative port"
    );
    let asked: Vec<Vec<u8>> = fake.calls().into_iter().map(|c| c.cdb).collect();
    assert!(
        asked.iter().all(|c| c[1] & 1 == 0),
        "no VPD request reached the device"
    );
    // Without a configured serial, the device's pages pass.
    let (fake, dev) = passed(Identity::default(), DeviceConfig::default());
    let (t, n) = target(dev);
    let page = vec![0x01, 0x80, 0, 3, b'X', b'Y', b'Z'];
    fake.then(Ok((
        page,
        Answer {
            resid: 248,
            ..good()
        },
    )));
    let d = t
        .execute(&n, l0(), &[0x12, 1, 0x80, 0, 255, 0], &[], 255)
        .data_in;
    assert_eq!(d, [0x01, 0x80, 0, 3, b'X', b'Y', b'Z']);
}

#[test]
fn naca_is_refused_and_pr_out_data_in_pieces_is_the_cores() {
    let (fake, t, n) = setup();
    let r = t.execute(&n, l0(), &[0x00, 0, 0, 0, 0, 0x04], &[], 0);
    assert_eq!(r.sense.unwrap().asc, Asc::INVALID_FIELD_IN_CDB);
    // PR OUT REGISTER with its parameter list in two pieces: gathered
    // for the core, which registers the key.
    let mut p = [0u64.to_be_bytes(), 0x77u64.to_be_bytes()].concat();
    p.resize(24, 0);
    let out: Vec<&[u8]> = vec![&p[..10], &p[10..]];
    let mut bufs = Buffers::data_out(&out);
    let cdb = [0x5f, 0, 0, 0, 0, 0, 0, 0, 24, 0];
    let r = t.submit_attr_into(
        &n,
        l0(),
        1,
        TaskAttr::Simple,
        &cdb,
        &[],
        24,
        Some(&mut bufs),
    );
    assert_eq!(r.status, Status::Good);
    let r = t.execute(&n, l0(), &[0x5e, 0, 0, 0, 0, 0, 0, 0, 16, 0], &[], 16);
    assert_eq!(r.data_in[8..16], 0x77u64.to_be_bytes());
    assert!(fake.calls().is_empty());
}

/// EDOM, what SG_IO says past the sg driver's requests per node.
fn libc_edom() -> i32 {
    33
}

#[test]
fn alua_states_refuse_before_the_device_and_groups_are_the_targets() {
    let (fake, t, a) = setup();
    t.set_relative_port_id("p", 1).unwrap();
    t.set_alua(Alua {
        groups: vec![PortGroup {
            id: 5,
            state: AccessState::Standby,
            preferred: false,
            ports: vec![1],
            status: Default::default(),
        }],
        explicit: false,
        transition_secs: 0,
    });
    let r = t.execute(&a, l0(), &[0; 6], &[], 0);
    assert_eq!(r.sense.unwrap().asc, Asc::ASYMMETRIC_ACCESS_STATE_CHANGED);
    let r10 = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    let r = t.execute(&a, l0(), &r10, &[], 512);
    assert_eq!(
        (r.status, r.sense.map(|s| (s.key, s.asc))),
        (
            Status::CheckCondition,
            Some((SenseKey::NotReady, Asc::LU_NOT_ACCESSIBLE_STANDBY))
        )
    );
    // REPORT TARGET PORT GROUPS is the core's: group 5, standby, port 1.
    let rtpg = [0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    let r = t.execute(&a, l0(), &rtpg, &[], 256);
    assert_eq!(r.status, Status::Good);
    assert_eq!(
        &r.data_in[..],
        &[0, 0, 0, 12, 0x02, 0x8f, 0, 5, 0, 0, 0, 1, 0, 0, 0, 1]
    );
    assert_eq!(fake.calls(), vec![], "nothing reached the device");
    // INQUIRY still reaches it.
    let r = t.execute(&a, l0(), &[0x12, 0, 0, 0, 36, 0], &[], 36);
    assert_eq!(r.status, Status::Good);
    assert_eq!(fake.calls().len(), 1);
}

/// VPD 83h of a device: an NAA designator (LU), and its own relative
/// target port designator (port 9), which is not the target's.
fn device_vpd83() -> Vec<u8> {
    let mut d = vec![0x00, 0x83, 0, 0];
    // NAA 6, LU association (00b), 16 bytes.
    d.extend_from_slice(&[0x01, 0x03, 0x00, 0x10]);
    d.extend_from_slice(&[0x60, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]);
    // Relative target port 9 (association 01b, type 4h).
    d.extend_from_slice(&[0x01, 0x14, 0x00, 0x04, 0, 0, 0, 9]);
    let n = (d.len() - 4) as u16;
    d[2..4].copy_from_slice(&n.to_be_bytes());
    d
}

/// The designators of VPD 83h data: (association and type byte, value).
fn designators(d: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let n = usize::from(u16::from_be_bytes([d[2], d[3]]));
    assert_eq!(d.len(), 4 + n, "PAGE LENGTH covers the page");
    let mut out = Vec::new();
    let mut at = 4;
    while at < d.len() {
        let l = usize::from(d[at + 3]);
        out.push((d[at + 1], d[at + 4..at + 4 + l].to_vec()));
        at += 4 + l;
    }
    out
}

#[test]
fn with_alua_groups_inquiry_shows_the_targets_tpgs_and_the_ports_group() {
    let (fake, t, a) = setup();
    t.set_relative_port_id("p", 2).unwrap();
    // No groups yet: the device's TPGS bits (11b) and its VPD 83h pass.
    let mut std = tape_inquiry();
    std[5] = 0x30;
    fake.then(Ok((std.clone(), good())));
    let d = t
        .execute(&a, l0(), &[0x12, 0, 0, 0, 36, 0], &[], 36)
        .data_in;
    assert_eq!(d[5] & 0x30, 0x30, "the device's own TPGS without groups");
    fake.then(Ok((device_vpd83(), good())));
    let d = t
        .execute(&a, l0(), &[0x12, 1, 0x83, 0, 255, 0], &[], 255)
        .data_in;
    assert_eq!(d, device_vpd83());

    t.set_alua(Alua {
        groups: vec![PortGroup {
            id: 7,
            state: AccessState::ActiveOptimized,
            preferred: false,
            ports: vec![2],
            status: Default::default(),
        }],
        explicit: false,
        transition_secs: 0,
    });
    // The state change's unit attention first (INQUIRY is not held by it).
    let r = t.execute(&a, l0(), &[0; 6], &[], 0);
    assert_eq!(r.sense.unwrap().asc, Asc::ASYMMETRIC_ACCESS_STATE_CHANGED);
    fake.then(Ok((std, good())));
    let d = t
        .execute(&a, l0(), &[0x12, 0, 0, 0, 36, 0], &[], 36)
        .data_in;
    assert_eq!(d[5] & 0x30, 0x10, "TPGS 01b: implicit ALUA, the target's");
    assert_eq!(d[5] & !0x30, 0, "the rest of byte 5 is the device's");
    assert_eq!(d[0], 0x01, "still the device's type");

    fake.then(Ok((device_vpd83(), good())));
    let d = t
        .execute(&a, l0(), &[0x12, 1, 0x83, 0, 255, 0], &[], 255)
        .data_in;
    assert_eq!(
        designators(&d),
        vec![
            (0x03, device_vpd83()[8..24].to_vec()),
            (0x14, vec![0, 0, 0, 2]),
            (0x15, vec![0, 0, 0, 7]),
        ],
        "the device's NAA; the target's relative port and group, not the device's port 9"
    );
    let probe = fake.calls().last().unwrap().cdb.clone();
    assert_eq!(
        probe,
        [0x12, 1, 0x83, 0x10, 0, 0],
        "the whole page was asked for"
    );
    // An allocation shorter than the page: the same bytes, cut.
    fake.then(Ok((device_vpd83(), good())));
    let r = t.execute(&a, l0(), &[0x12, 1, 0x83, 0, 30, 0], &[], 30);
    assert_eq!(r.data_in, d[..30]);
    assert_eq!(r.residual, Residual::None);
    // The device refusing the page: its answer passes.
    let refusal = Sense::new(SenseKey::IllegalRequest, Asc::INVALID_FIELD_IN_CDB).to_fixed();
    fake.then(Ok((Vec::new(), check_condition(refusal.clone()))));
    let r = t.execute(&a, l0(), &[0x12, 1, 0x83, 0, 255, 0], &[], 255);
    assert_eq!(r.status, Status::CheckCondition);
    assert_eq!(r.sense_bytes().unwrap(), refusal);

    // With a configured serial the target's page carries the group too.
    let config = DeviceConfig {
        serial: "SN-7".into(),
        ..DeviceConfig::default()
    };
    let identity = Identity {
        serial: true,
        ..Identity::default()
    };
    let (fake, dev) = passed(identity, config);
    let (t, n) = target(dev);
    t.set_relative_port_id("p", 2).unwrap();
    t.set_alua(Alua {
        groups: vec![PortGroup {
            id: 7,
            state: AccessState::ActiveOptimized,
            preferred: false,
            ports: vec![2],
            status: Default::default(),
        }],
        explicit: true,
        transition_secs: 0,
    });
    let _ = t.execute(&n, l0(), &[0; 6], &[], 0);
    fake.then(Ok((tape_inquiry(), good())));
    let d = t
        .execute(&n, l0(), &[0x12, 1, 0x83, 0, 255, 0], &[], 255)
        .data_in;
    let ds = designators(&d);
    assert!(ds.contains(&(0x14, vec![0, 0, 0, 2])), "{ds:?}");
    assert!(ds.contains(&(0x15, vec![0, 0, 0, 7])), "{ds:?}");
    fake.then(Ok((tape_inquiry(), good())));
    let d = t
        .execute(&n, l0(), &[0x12, 0, 0, 0, 36, 0], &[], 36)
        .data_in;
    assert_eq!(d[5] & 0x30, 0x30, "TPGS 11b: explicit allowed");
}

/// A tape drive in fixed-block mode (SSC-3), as small as the test needs:
/// READ(6)/WRITE(6) with FIXED=1, WRITE FILEMARKS(6), REWIND, SPACE
/// (blocks and filemarks) and READ POSITION's short form. A record is a
/// block or a filemark (`None`); `at` is the position in records. Each
/// command is recorded with the direction and length the executor got.
struct Tape {
    block: usize,
    records: Mutex<(Vec<Option<Vec<u8>>>, usize)>,
    calls: Mutex<Vec<(u8, DataDir, usize, usize)>>,
    /// The timeout each command was given, in order.
    timeouts: Mutex<Vec<u32>>,
}

impl Tape {
    fn new(block: usize) -> Arc<Tape> {
        Arc::new(Tape {
            block,
            records: Mutex::new((Vec::new(), 0)),
            timeouts: Mutex::default(),
            calls: Mutex::new(Vec::new()),
        })
    }
}

/// Fixed sense with the tape's FILEMARK/EOM/ILI bits and an INFORMATION
/// field (SSC-3 4.2.6: the residue in blocks).
fn tape_sense(key: u8, bits: u8, info: u32, asc: (u8, u8)) -> Vec<u8> {
    let mut s = vec![0u8; 18];
    s[0] = 0xf0; // VALID, current, fixed
    s[2] = bits | key;
    s[3..7].copy_from_slice(&info.to_be_bytes());
    s[7] = 10;
    (s[12], s[13]) = asc;
    s
}

struct TapeExec(Arc<Tape>);

impl Executor for TapeExec {
    fn execute(&self, cdb: &[u8], data: Data<'_, '_>, t: u32) -> Result<Answer, ExecError> {
        let tape = &self.0;
        tape.timeouts.lock().unwrap().push(t);
        let pieces = match &data {
            Data::In(p) => p.len(),
            Data::Out(p) => p.len(),
            Data::None => 0,
        };
        tape.calls
            .lock()
            .unwrap()
            .push((cdb[0], data.dir(), data.len(), pieces));
        let mut g = tape.records.lock().unwrap();
        let (records, at) = &mut *g;
        let count24 = || u32::from_be_bytes([0, cdb[2], cdb[3], cdb[4]]) as usize;
        let bad = || Ok(check_condition(tape_sense(0x05, 0, 0, (0x24, 0))));
        match (cdb[0], data) {
            (0x01, Data::None) => {
                *at = 0;
                Ok(good())
            }
            (0x0a, Data::Out(p)) if cdb[1] & 1 == 1 => {
                let bytes = p.concat();
                if bytes.len() != count24() * tape.block {
                    return bad();
                }
                // Writing ends the medium's data at the position.
                records.truncate(*at);
                for b in bytes.chunks(tape.block) {
                    records.push(Some(b.to_vec()));
                }
                *at = records.len();
                Ok(good())
            }
            (0x10, Data::None) => {
                records.truncate(*at);
                records.extend((0..count24()).map(|_| None));
                *at = records.len();
                Ok(good())
            }
            (0x08, Data::In(p)) if cdb[1] & 1 == 1 => {
                let want = count24();
                let mut out = Vec::new();
                let mut sense = None;
                for k in 0..want {
                    match records.get(*at) {
                        Some(Some(b)) => {
                            out.extend_from_slice(b);
                            *at += 1;
                        }
                        // A filemark: read stops past it, FILEMARK set.
                        Some(None) => {
                            *at += 1;
                            sense = Some(tape_sense(0, 0x80, (want - k) as u32, (0, 1)));
                            break;
                        }
                        // End of data: BLANK CHECK.
                        None => {
                            sense = Some(tape_sense(0x08, 0, (want - k) as u32, (0, 5)));
                            break;
                        }
                    }
                }
                let mut src = out.iter();
                for piece in p.iter_mut() {
                    for b in piece.iter_mut() {
                        if let Some(x) = src.next() {
                            *b = *x;
                        }
                    }
                }
                let resid = want * tape.block - out.len();
                Ok(match sense {
                    Some(s) => Answer {
                        resid,
                        ..check_condition(s)
                    },
                    None => good(),
                })
            }
            (0x11, Data::None) => {
                // SPACE: a 24-bit two's complement count of blocks (code
                // 0) or filemarks (code 1).
                let n = i32::from_be_bytes([cdb[2], cdb[3], cdb[4], 0]) >> 8;
                match cdb[1] & 0x0f {
                    0 => {
                        let to = *at as i64 + i64::from(n);
                        if to < 0 || to as usize > records.len() {
                            return bad();
                        }
                        *at = to as usize;
                    }
                    1 if n > 0 => {
                        for _ in 0..n {
                            match records[*at..].iter().position(Option::is_none) {
                                Some(k) => *at += k + 1,
                                None => return bad(),
                            }
                        }
                    }
                    _ => return bad(),
                }
                Ok(good())
            }
            (0x34, Data::In(p)) => {
                // Short form (SSC-3 7.7.2): BOP, then first and last
                // block locations.
                let mut d = [0u8; 20];
                d[0] = if *at == 0 { 0x80 } else { 0 };
                d[4..8].copy_from_slice(&(*at as u32).to_be_bytes());
                d[8..12].copy_from_slice(&(*at as u32).to_be_bytes());
                let mut src = d.iter();
                for piece in p.iter_mut() {
                    for b in piece.iter_mut() {
                        if let Some(x) = src.next() {
                            *b = *x;
                        }
                    }
                }
                Ok(good())
            }
            (0x12, Data::In(p)) => {
                let d = tape_inquiry();
                let mut src = d.iter();
                let mut n = 0;
                for piece in p.iter_mut() {
                    for b in piece.iter_mut() {
                        if let Some(x) = src.next() {
                            *b = *x;
                            n += 1;
                        }
                    }
                }
                let len: usize = p.iter().map(|x| x.len()).sum();
                Ok(Answer {
                    resid: len - n,
                    ..good()
                })
            }
            _ => Ok(check_condition(tape_sense(0x05, 0, 0, (0x20, 0)))),
        }
    }

    fn reset_device(&self) -> Result<(), ExecError> {
        Ok(())
    }
}

/// Runs `cdb` through the target with the data in `pieces` of the given
/// sizes (data-out `out`, or data-in of `expect` bytes), as a transport
/// brings them: the response and the data-in gathered.
fn through_pieces(
    t: &Target,
    n: &Nexus,
    cdb: &[u8],
    out: &[u8],
    expect: usize,
    cut: usize,
) -> (ScsiResponse, Vec<u8>) {
    if !out.is_empty() {
        let pieces: Vec<&[u8]> = out.chunks(cut).collect();
        let mut bufs = Buffers::data_out(&pieces);
        let r = t.submit_attr_into(
            n,
            l0(),
            1,
            TaskAttr::Simple,
            cdb,
            &[],
            out.len() as u64,
            Some(&mut bufs),
        );
        return (r, Vec::new());
    }
    let mut backing = vec![0u8; expect];
    let mut pieces: Vec<&mut [u8]> = backing.chunks_mut(cut.max(1)).collect();
    let mut bufs = Buffers::data_in(&mut pieces);
    let r = t.submit_attr_into(
        n,
        l0(),
        1,
        TaskAttr::Simple,
        cdb,
        &[],
        expect as u64,
        Some(&mut bufs),
    );
    let got = match bufs.placed() {
        0 => r.data_in.clone(),
        placed => backing[..placed].to_vec(),
    };
    (r, got)
}

#[test]
fn a_tape_drive_passes_its_commands_with_the_transports_directions_and_lengths() {
    const BLOCK: usize = 512;
    let tape = Tape::new(BLOCK);
    let h = PassThrough::new(Box::new(TapeExec(tape.clone())), Identity::default());
    let dev = Device::pass_through(DeviceConfig::default(), h).unwrap();
    let (t, n) = target(dev);
    // Every byte of block k says k and where in the block it is.
    let blocks = |from: usize, count: usize| -> Vec<u8> {
        (from..from + count)
            .flat_map(|k| (0..BLOCK).map(move |i| (k * 7 + i) as u8))
            .collect()
    };
    let inq = t
        .execute(&n, l0(), &[0x12, 0, 0, 0, 36, 0], &[], 36)
        .data_in;
    assert_eq!(
        inq[0], 0x01,
        "a sequential-access device, the device's type"
    );

    // WRITE(6) FIXED: 5 blocks from pieces of 700 bytes (not block
    // aligned), then a filemark, then 3 more blocks.
    let (r, _) = through_pieces(&t, &n, &[0x0a, 0x01, 0, 0, 5, 0], &blocks(0, 5), 0, 700);
    assert_eq!(r.status, Status::Good);
    let r = t.execute(&n, l0(), &[0x10, 0x01, 0, 0, 1, 0], &[], 0);
    assert_eq!(r.status, Status::Good);
    let (r, _) = through_pieces(&t, &n, &[0x0a, 0x01, 0, 0, 3, 0], &blocks(5, 3), 0, 512);
    assert_eq!(r.status, Status::Good);

    // REWIND, READ POSITION: beginning of partition, block 0.
    assert_eq!(
        t.execute(&n, l0(), &[0x01, 0, 0, 0, 0, 0], &[], 0).status,
        Status::Good
    );
    let (r, pos) = through_pieces(&t, &n, &[0x34, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 20, 7);
    assert_eq!(r.status, Status::Good);
    assert_eq!(pos[0] & 0x80, 0x80, "BOP");
    assert_eq!(&pos[4..8], &[0, 0, 0, 0]);

    // SPACE 2 blocks forward, READ(6) FIXED 3 blocks into 300-byte
    // pieces: blocks 2, 3, 4 byte for byte.
    let r = t.execute(&n, l0(), &[0x11, 0x00, 0, 0, 2, 0], &[], 0);
    assert_eq!(r.status, Status::Good);
    let (r, got) = through_pieces(&t, &n, &[0x08, 0x01, 0, 0, 3, 0], &[], 3 * BLOCK, 300);
    assert_eq!(r.status, Status::Good);
    assert!(got == blocks(2, 3), "blocks 2..5 read back as written");

    // READ(6) of 2 blocks at the filemark: CHECK CONDITION with the
    // drive's FILEMARK bit and INFORMATION (2 blocks not read), the
    // whole transfer a residual.
    let (r, _) = through_pieces(&t, &n, &[0x08, 0x01, 0, 0, 2, 0], &[], 2 * BLOCK, 512);
    assert_eq!(r.status, Status::CheckCondition);
    let s = r.sense_bytes().unwrap();
    assert_eq!(
        s,
        tape_sense(0, 0x80, 2, (0, 1)),
        "the drive's sense as it gave it"
    );
    assert_eq!(r.residual, Residual::Under(2 * BLOCK as u64));

    // SPACE back one filemark is refused by this drive; SPACE -1 block
    // (24-bit two's complement) is taken: the position is the filemark.
    let r = t.execute(&n, l0(), &[0x11, 0x00, 0xff, 0xff, 0xff, 0], &[], 0);
    assert_eq!(r.status, Status::Good);
    let (_, pos) = through_pieces(&t, &n, &[0x34, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[], 20, 20);
    assert_eq!(&pos[4..8], &[0, 0, 0, 5], "at the filemark (record 5)");
    // Past it, the last 3 blocks; then BLANK CHECK at the end of data.
    let r = t.execute(&n, l0(), &[0x11, 0x01, 0, 0, 1, 0], &[], 0);
    assert_eq!(r.status, Status::Good);
    let (r, got) = through_pieces(&t, &n, &[0x08, 0x01, 0, 0, 4, 0], &[], 4 * BLOCK, 1000);
    assert_eq!(r.status, Status::CheckCondition);
    assert_eq!(r.sense.unwrap().key, SenseKey::from(0x08), "BLANK CHECK");
    assert_eq!(r.residual, Residual::Under(BLOCK as u64));
    assert!(
        got[..3 * BLOCK] == blocks(5, 3),
        "the 3 blocks past the filemark"
    );

    // What the drive was asked: every direction and length the
    // transport's, in as many pieces as the transport brought.
    let calls = tape.calls.lock().unwrap().clone();
    let want = [
        (0x12, DataDir::In, 36, 1),
        (0x0a, DataDir::Out, 5 * BLOCK, 4),
        (0x10, DataDir::None, 0, 0),
        (0x0a, DataDir::Out, 3 * BLOCK, 3),
        (0x01, DataDir::None, 0, 0),
        (0x34, DataDir::In, 20, 3),
        (0x11, DataDir::None, 0, 0),
        (0x08, DataDir::In, 3 * BLOCK, 6),
        (0x08, DataDir::In, 2 * BLOCK, 2),
        (0x11, DataDir::None, 0, 0),
        (0x34, DataDir::In, 20, 1),
        (0x11, DataDir::None, 0, 0),
        (0x08, DataDir::In, 4 * BLOCK, 3),
    ];
    assert_eq!(calls, want);
    // Positioning and filemarks may take minutes on a real drive: they
    // get the long timeout, data transfers and INQUIRY the ordinary one.
    let timeouts = tape.timeouts.lock().unwrap().clone();
    let expect: Vec<u32> = want
        .iter()
        .map(|c| match c.0 {
            0x01 | 0x10 | 0x11 => LONG_TIMEOUT_MS,
            _ => DEFAULT_TIMEOUT_MS,
        })
        .collect();
    assert_eq!(timeouts, expect);
}
