//! `threads_num` (SCST's per-device threads, issue 29 item 4): a device
//! that has threads of its own runs its commands on them, not on the
//! port's shared workers, so a device whose I/O hangs holds up no other
//! device's commands; per initiator (SCST's `threads_pool_type`), each
//! session has them to itself. The target port and our initiator in this
//! process over soft RoCE on 127.129.29.x.

use rdma_types::{Guid, Lid};
use rnic::softroce::{SoftCa, SoftRoce, ROCE_PORT};
use srp::initiator::ChannelConfig;
use srp::target::TargetConfig;
use srp::wire::{Lun, TaskAttr};
use srp_initiator::session::{Session, SessionConfig, Xfer};
use srp_target::{PortOptions, TargetPort};
use std::io;
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Duration;

const TGT: u64 = 0x0002_c903_0029_0b01;
const INI: u64 = 0x0002_c903_0029_0b02;

/// A RAM store that notes the name of the thread of every read, and whose
/// reads wait at a gate while it is closed (telling a channel they came).
struct Noting {
    ram: scsi::Ram,
    threads: Mutex<Vec<String>>,
    open: Mutex<bool>,
    cv: Condvar,
    arrived: Mutex<mpsc::Sender<()>>,
}

impl Noting {
    fn new() -> (Arc<Noting>, mpsc::Receiver<()>) {
        let (tx, rx) = mpsc::channel();
        let n = Noting {
            ram: scsi::Ram::new(1 << 20),
            threads: Mutex::new(Vec::new()),
            open: Mutex::new(true),
            cv: Condvar::new(),
            arrived: Mutex::new(tx),
        };
        (Arc::new(n), rx)
    }

    fn set_open(&self, open: bool) {
        *self.open.lock().unwrap() = open;
        self.cv.notify_all();
    }

    fn threads(&self) -> Vec<String> {
        std::mem::take(&mut *self.threads.lock().unwrap())
    }
}

impl scsi::Backend for Noting {
    fn size(&self) -> u64 {
        self.ram.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let name = std::thread::current().name().unwrap_or("").to_string();
        self.threads.lock().unwrap().push(name);
        let _ = self.arrived.lock().unwrap().send(());
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.cv.wait(open).unwrap();
        }
        self.ram.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        self.ram.write(offset, data, fua)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
}

fn device(store: Arc<Noting>, threads_num: u32) -> Arc<scsi::Device> {
    pooled(store, threads_num, scsi::ThreadsPool::Shared)
}

fn pooled(store: Arc<Noting>, threads_num: u32, pool: scsi::ThreadsPool) -> Arc<scsi::Device> {
    let cfg = scsi::DeviceConfig {
        threads_num,
        threads_pool: pool,
        ..Default::default()
    };
    Arc::new(scsi::Device::new(cfg, store).unwrap())
}

/// The tests here count this process's device threads: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Threads of this process named as a device's own (`srpt-dev-N`).
fn device_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|n| n.trim_end().starts_with("srpt-dev-"))
        })
        .count()
}

/// Waits (bounded: 20 s) until `f` holds.
fn eventually(what: &str, f: impl Fn() -> bool) {
    let end = std::time::Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(std::time::Instant::now() < end, "{what}: not within 20 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn lun(n: u64) -> Lun {
    Lun::from_u64(n << 48)
}

const READ8: [u8; 10] = [0x28, 0, 0, 0, 0, 8, 0, 0, 8, 0];

/// Reads 4 KiB of `l`, insisting on GOOD.
fn read(s: &Session, l: Lun) {
    let r = s.execute(l, &READ8, Xfer::In(4096)).unwrap();
    assert!(r.good(), "{:?}", r.status);
}

#[test]
fn a_device_with_threads_of_its_own_runs_on_them_and_holds_up_no_other() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let ca = |guid: u64, last: u8| SoftCa {
        guid: Guid(guid),
        ip: std::net::Ipv4Addr::new(127, 129, 29, last).into(),
    };
    let p = SoftRoce::new(vec![ca(TGT, 11), ca(INI, 12)], ROCE_PORT);
    let (own, own_arrived) = Noting::new();
    let (shared, _) = Noting::new();
    let scsi = Arc::new(scsi::Target::new());
    scsi.add_lun(None, scsi::Lun::new(0).unwrap(), device(own.clone(), 2));
    scsi.add_lun(None, scsi::Lun::new(1).unwrap(), device(shared.clone(), 0));
    let chan = ChannelConfig::new(1, Guid(INI), TGT, Guid(TGT));
    let tcfg = TargetConfig::new(chan.target_port_id(), "device-threads");
    // One shared worker: a held command there would stop every other.
    let opts = PortOptions {
        workers: 1,
        ..PortOptions::default()
    };
    let port = Arc::new(TargetPort::start(p.clone(), Guid(TGT), tcfg, scsi, opts).unwrap());
    let direct = Arc::new(srpstack::Direct::new(port.clone(), Lid(0)));
    let s = Session::connect(p.clone(), Guid(INI), direct, SessionConfig::new(chan)).unwrap();
    // Past each LUN's power-on unit attention (bounded).
    for l in [lun(0), lun(1)] {
        let tur = [0u8; 6];
        let good = (0..5).any(|_| s.execute(l, &tur, Xfer::None).unwrap().good());
        assert!(good, "TEST UNIT READY never GOOD");
    }

    for _ in 0..20 {
        read(&s, lun(0));
        read(&s, lun(1));
    }
    let names = own.threads();
    assert_eq!(names.len(), 20);
    assert!(
        names.iter().all(|n| n == "srpt-dev-0" || n == "srpt-dev-1"),
        "threads_num 2: the device's own two threads: {names:?}"
    );
    let names = shared.threads();
    assert!(
        names.iter().all(|n| n.starts_with("srpt-scsi-")),
        "threads_num 0: the port's workers: {names:?}"
    );
    while own_arrived.try_recv().is_ok() {}

    // Both of the device's threads held in its store: the other device's
    // commands still run on the port's one worker.
    own.set_open(false);
    let held: Vec<_> = (0..2)
        .map(|_| {
            s.start(lun(0), &READ8, &Xfer::In(4096), TaskAttr::Simple)
                .unwrap()
        })
        .collect();
    for _ in 0..2 {
        own_arrived
            .recv_timeout(Duration::from_secs(20))
            .expect("a held read reached the store");
    }
    for _ in 0..5 {
        read(&s, lun(1));
    }
    own.set_open(true);
    for c in held {
        assert!(s.finish(c, Xfer::In(4096)).good());
    }
    drop(s);
    port.stop();
}

/// Two sessions to one device with one thread of its own. Per initiator
/// (SCST's default): the second session's read reaches the store while
/// the first's is held there, on a thread of the second's, which ends
/// with its session. Shared: both sessions' commands run on one thread.
#[test]
fn per_initiator_pools_are_each_sessions_own_and_end_with_it() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for (pool, last) in [
        (scsi::ThreadsPool::PerInitiator, 21),
        (scsi::ThreadsPool::Shared, 31),
    ] {
        let ca = |guid: u64, last: u8| SoftCa {
            guid: Guid(guid),
            ip: std::net::Ipv4Addr::new(127, 129, 29, last).into(),
        };
        let p = SoftRoce::new(vec![ca(TGT, last), ca(INI, last + 1)], ROCE_PORT);
        let (store, arrived) = Noting::new();
        let scsi = Arc::new(scsi::Target::new());
        scsi.add_lun(
            None,
            scsi::Lun::new(0).unwrap(),
            pooled(store.clone(), 1, pool),
        );
        let chan = |ext: u64| ChannelConfig::new(ext, Guid(INI), TGT, Guid(TGT));
        let tcfg = TargetConfig::new(chan(1).target_port_id(), "device-pools");
        let port = Arc::new(
            TargetPort::start(p.clone(), Guid(TGT), tcfg, scsi, PortOptions::default()).unwrap(),
        );
        let direct = Arc::new(srpstack::Direct::new(port.clone(), Lid(0)));
        let connect = |ext: u64| {
            let s = Session::connect(
                p.clone(),
                Guid(INI),
                direct.clone(),
                SessionConfig::new(chan(ext)),
            )
            .unwrap();
            let tur = [0u8; 6];
            let good = (0..5).any(|_| s.execute(lun(0), &tur, Xfer::None).unwrap().good());
            assert!(good, "TEST UNIT READY never GOOD");
            s
        };
        let (s1, s2) = (connect(1), connect(2));
        read(&s1, lun(0));
        read(&s2, lun(0));
        let want = if pool == scsi::ThreadsPool::PerInitiator {
            2
        } else {
            1
        };
        assert_eq!(device_threads(), want, "{pool:?}: the device's threads");
        while arrived.try_recv().is_ok() {}
        if pool == scsi::ThreadsPool::PerInitiator {
            store.set_open(false);
            let c1 = s1
                .start(lun(0), &READ8, &Xfer::In(4096), TaskAttr::Simple)
                .unwrap();
            arrived
                .recv_timeout(Duration::from_secs(20))
                .expect("the first session's read reached the store");
            let c2 = s2
                .start(lun(0), &READ8, &Xfer::In(4096), TaskAttr::Simple)
                .unwrap();
            arrived
                .recv_timeout(Duration::from_secs(20))
                .expect("the second session's read reached the store while the first's was held");
            store.set_open(true);
            assert!(s1.finish(c1, Xfer::In(4096)).good());
            assert!(s2.finish(c2, Xfer::In(4096)).good());
        }
        drop(s2);
        eventually("the second session's device thread ends", || {
            device_threads() == 1
        });
        read(&s1, lun(0));
        drop(s1);
        port.stop();
        assert_eq!(
            device_threads(),
            0,
            "{pool:?}: threads left after the port stopped"
        );
    }
}
