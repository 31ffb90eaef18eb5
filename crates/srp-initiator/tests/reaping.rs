//! Caller-driven progress: a caller waiting for its answer reaps the CQ
//! itself, and answers it reaps for other callers wake them. Against the
//! real target port on the loopback provider, seen by the initiator
//! through a provider that never calls its completion handler: every
//! answer then comes through a waiting caller's own polling, so a caller
//! that does not reap, or an answer reaped for another caller that does
//! not reach it, shows as a hang. (With no callback, a caller whose answer
//! outlasts its polling sleeps out its bounded park, 200 ms, unless
//! another reaper wakes it: these tests check that answers arrive, not how
//! soon.)

mod common;

use common::{fabric, target_port, wait_for, Direct, Gate, Held, Hold};
use rdma_types::{AccessFlags, Guid, PortNum, Qpn};
use srp::initiator::ChannelConfig;
use srp::wire::{Lun, TaskAttr};
use srp_initiator::session::{Session, SessionConfig, Xfer};
use srp_target::PortOptions;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;
use verbs::{
    CaHandle, CqHandle, CqInit, EventHandler, MemBuf, MrHandle, MrInfo, PdHandle, PortAttr,
    Provider, QpAttr, QpHandle, QpInit, RecvWr, SendWr, WorkCompletion,
};

const TARGET_GUID: u64 = 0x0002_c903_0000_7111;
const INIT_GUID: u64 = 0x0002_c903_0000_7222;
const BLOCK: usize = 512;

/// Passes every verb to the loopback, but the handler of each CA opened
/// through it never hears of a completion: a provider whose thread is
/// always busy elsewhere.
struct Deaf(Arc<dyn Provider>);

struct NoCompletions(Arc<dyn EventHandler>);

impl EventHandler for NoCompletions {
    fn on_completion(&self, _cq_ctx: u64) {}
    fn on_async_event(&self, event: verbs::AsyncEvent) {
        self.0.on_async_event(event);
    }
    fn on_destroyed(&self, kind: verbs::ResourceKind, ctx: u64) {
        self.0.on_destroyed(kind, ctx);
    }
}

impl Provider for Deaf {
    fn name(&self) -> &'static str {
        "deaf loopback"
    }
    fn handlers_nest(&self) -> bool {
        self.0.handlers_nest()
    }
    fn list_cas(&self) -> Vec<Guid> {
        self.0.list_cas()
    }
    fn open_ca(
        &self,
        guid: Guid,
        ctx: u64,
        handler: Arc<dyn EventHandler>,
    ) -> verbs::Result<CaHandle> {
        self.0.open_ca(guid, ctx, Arc::new(NoCompletions(handler)))
    }
    fn query_ca(&self, ca: CaHandle) -> verbs::Result<verbs::CaAttr> {
        self.0.query_ca(ca)
    }
    fn close_ca(&self, ca: CaHandle) -> verbs::Result<()> {
        self.0.close_ca(ca)
    }
    fn query_port(&self, ca: CaHandle, port: PortNum) -> verbs::Result<PortAttr> {
        self.0.query_port(ca, port)
    }
    fn alloc_pd(&self, ca: CaHandle, ctx: u64) -> verbs::Result<PdHandle> {
        self.0.alloc_pd(ca, ctx)
    }
    fn dealloc_pd(&self, pd: PdHandle) -> verbs::Result<()> {
        self.0.dealloc_pd(pd)
    }
    fn create_cq(&self, pd: PdHandle, init: &CqInit, ctx: u64) -> verbs::Result<CqHandle> {
        self.0.create_cq(pd, init, ctx)
    }
    fn destroy_cq(&self, cq: CqHandle) -> verbs::Result<()> {
        self.0.destroy_cq(cq)
    }
    fn poll_cq(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> verbs::Result<usize> {
        self.0.poll_cq(cq, out)
    }
    fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> verbs::Result<()> {
        self.0.req_notify_cq(cq, solicited_only)
    }
    fn create_qp(&self, pd: PdHandle, init: &QpInit, ctx: u64) -> verbs::Result<QpHandle> {
        self.0.create_qp(pd, init, ctx)
    }
    fn qp_num(&self, qp: QpHandle) -> verbs::Result<Qpn> {
        self.0.qp_num(qp)
    }
    fn modify_qp(&self, qp: QpHandle, attr: &QpAttr) -> verbs::Result<()> {
        self.0.modify_qp(qp, attr)
    }
    fn query_qp(&self, qp: QpHandle) -> verbs::Result<QpAttr> {
        self.0.query_qp(qp)
    }
    fn destroy_qp(&self, qp: QpHandle) -> verbs::Result<()> {
        self.0.destroy_qp(qp)
    }
    fn reg_mr(
        &self,
        pd: PdHandle,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
        ctx: u64,
    ) -> verbs::Result<MrInfo> {
        self.0.reg_mr(pd, buf, addr, len, access, ctx)
    }
    fn dereg_mr(&self, mr: MrHandle) -> verbs::Result<()> {
        self.0.dereg_mr(mr)
    }
    fn post_send(&self, qp: QpHandle, wrs: &[SendWr]) -> verbs::Result<()> {
        self.0.post_send(qp, wrs)
    }
    fn post_recv(&self, qp: QpHandle, wrs: &[RecvWr]) -> verbs::Result<()> {
        self.0.post_recv(qp, wrs)
    }
    fn drive_cq(&self, cq: CqHandle, spin: Duration, timeout: Duration) -> verbs::Result<bool> {
        if WATCHED.with(|w| w.get()) {
            WATCHED_DRIVES.fetch_add(1, Ordering::SeqCst);
        }
        self.0.drive_cq(cq, spin, timeout)
    }
}

thread_local! {
    /// This thread's `drive_cq` calls are counted in [`WATCHED_DRIVES`].
    static WATCHED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `drive_cq` calls of the watched thread (one test watches one).
static WATCHED_DRIVES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A session over the deaf provider to a target port whose LUN 0 is a
/// RAM store of `bytes` that holds WRITEs at `gate` while it is closed.
fn session(bytes: u64, gate: Arc<Gate>) -> (Arc<Session>, Arc<srp_target::TargetPort>) {
    let loopback: Arc<dyn Provider> = fabric(&[TARGET_GUID, INIT_GUID]);
    let chan = ChannelConfig::new(0x71, Guid(INIT_GUID), TARGET_GUID, Guid(TARGET_GUID));
    let dev = scsi::Device::new(
        scsi::DeviceConfig::default(),
        Arc::new(Held::new(bytes, gate, Hold::Writes)),
    )
    .unwrap();
    let port = target_port(
        &loopback,
        TARGET_GUID,
        chan.target_port_id(),
        "reaping",
        vec![dev],
        PortOptions::default(),
    );
    let direct = Arc::new(Direct {
        port: port.clone(),
        lid: rdma_types::Lid(1),
        on_disconnect: None,
    });
    let deaf: Arc<dyn Provider> = Arc::new(Deaf(loopback));
    let s = Session::connect(deaf, Guid(INIT_GUID), direct, SessionConfig::new(chan)).unwrap();
    // The LU's power-on unit attention goes to this TEST UNIT READY.
    let _ = s.execute(Lun::from_u64(0), &[0; 6], Xfer::None).unwrap();
    (Arc::new(s), port)
}

fn rw16(write: bool, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = if write { 0x8a } else { 0x88 };
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// A block that says where it belongs (its LBA in every 8 bytes).
fn stamp(lba: u64) -> Vec<u8> {
    lba.to_be_bytes().repeat(BLOCK / 8)
}

fn write(s: &Session, lba: u64) {
    let r = s
        .execute(
            Lun::from_u64(0),
            &rw16(true, lba, 1),
            Xfer::Out(&stamp(lba)),
        )
        .unwrap();
    assert!(r.good(), "WRITE {lba}: {r:?}");
}

fn read(s: &Session, lba: u64) -> Vec<u8> {
    let mut buf = vec![0u8; BLOCK];
    let r = s
        .execute(Lun::from_u64(0), &rw16(false, lba, 1), Xfer::InTo(&mut buf))
        .unwrap();
    assert!(r.good(), "READ {lba}: {r:?}");
    buf
}

/// Runs `f` on a thread of its own; its result, or a failure after
/// `secs` (a caller left waiting for an answer nobody reaps).
fn bounded<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .expect("a waiting caller was never answered")
}

#[test]
fn callers_reap_their_answers_when_the_provider_calls_nobody_back() {
    let (s, _port) = session(1 << 20, Arc::new(Gate::default()));
    // Four threads at once, each writing and reading back its own
    // blocks: the reaper role passes between them all the time, and each
    // answer reaped by one thread for another must reach its caller.
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                for i in 0..25u64 {
                    let lba = t * 256 + i;
                    write(&s, lba);
                    assert_eq!(read(&s, lba), stamp(lba), "LBA {lba}");
                }
            })
        })
        .collect();
    bounded(60, move || {
        for t in threads {
            t.join().unwrap();
        }
    });
    assert_eq!(s.stats().completed, 1 + 4 * 2 * 25);
}

#[test]
fn an_answer_reaped_by_another_caller_reaches_its_own() {
    let gate = Arc::new(Gate::default());
    let (s, _port) = session(1 << 20, gate.clone());
    // B's WRITE waits at the target; B polls, then sleeps.
    gate.set(true);
    let b = {
        let s = s.clone();
        std::thread::spawn(move || write(&s, 7))
    };
    wait_for("B's WRITE at the target", 10, || {
        gate.held.load(Ordering::SeqCst) > 0
    });
    // A reads on while B sleeps, so the one reaping when B's answer comes
    // is, as a rule, A; B must get it all the same.
    let b_done = Arc::new(AtomicBool::new(false));
    let a = {
        let (s, b_done) = (s.clone(), b_done.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !b_done.load(Ordering::SeqCst) {
                read(&s, 100);
                n += 1;
            }
            n
        })
    };
    wait_for("A under way", 10, || s.stats().completed > 10);
    gate.set(false);
    bounded(30, move || b.join().unwrap());
    b_done.store(true, Ordering::SeqCst);
    assert!(a.join().unwrap() > 0);
    assert_eq!(read(&s, 7), stamp(7));
}

#[test]
fn a_lone_waiting_caller_drives_the_provider_with_many_commands_outstanding() {
    let gate = Arc::new(Gate::default());
    let (s, _port) = session(1 << 20, gate.clone());
    // Eight WRITEs held at the target, and this thread the session's
    // only waiting caller: it asks the provider to let it move the NIC
    // (a deeper queue used to leave that to the NIC's thread).
    gate.set(true);
    WATCHED.with(|w| w.set(true));
    let cmds: Vec<_> = (0..8u64)
        .map(|i| {
            s.start(
                Lun::from_u64(0),
                &rw16(true, i, 1),
                &Xfer::Out(&stamp(i)),
                TaskAttr::Simple,
            )
            .unwrap()
        })
        .collect();
    let opener = {
        let gate = gate.clone();
        std::thread::spawn(move || {
            // Open once the waiting caller drove, or after 10 s (then the
            // assertion below says why).
            let end = std::time::Instant::now() + Duration::from_secs(10);
            while WATCHED_DRIVES.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < end {
                std::thread::yield_now();
            }
            gate.set(false);
        })
    };
    let mut left: Vec<_> = cmds.into_iter().collect();
    while !left.is_empty() {
        let i = s.wait_any(&left.iter().collect::<Vec<_>>());
        let r = s.finish(left.swap_remove(i), Xfer::None);
        assert!(r.good(), "{r:?}");
    }
    WATCHED.with(|w| w.set(false));
    opener.join().unwrap();
    assert!(
        WATCHED_DRIVES.load(Ordering::SeqCst) > 0,
        "the lone caller with 8 commands outstanding never drove"
    );
}
