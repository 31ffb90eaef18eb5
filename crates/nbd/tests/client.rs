//! The server over real sockets, driven by the Rust client in `common`.

mod common;

use blockload::{BlockDevice, RamDevice};
use common::{pattern, tcp, Client, Rng, TempDir};
use nbd::wire::{command_flags, transmission_flags as tf, Command, Errno, OptionCode, ReplyType};
use nbd::{Export, ListenAddr, Server};
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

const MIB: u64 = 1 << 20;

fn serve(bs: u32, bytes: u64, name: &str) -> (nbd::ServerHandle, Arc<RamDevice>) {
    let dev = Arc::new(RamDevice::new(bs, bytes / u64::from(bs)));
    let h = Server::bind_tcp("127.0.0.1:0", Export::new(name, dev.clone()))
        .unwrap()
        .spawn()
        .unwrap();
    (h, dev)
}

#[test]
fn go_then_write_read_flush_trim_zeroes_and_range_errors() {
    let (h, dev) = serve(4096, 4 * MIB, "lun0");
    let mut c = Client::go(tcp(h.local_addr()), "lun0");
    assert_eq!(c.info.size, 4 * MIB);
    let want = tf::HAS_FLAGS
        | tf::SEND_FLUSH
        | tf::SEND_FUA
        | tf::SEND_TRIM
        | tf::SEND_WRITE_ZEROES
        | tf::CAN_MULTI_CONN;
    assert_eq!(c.info.flags, want);
    let b = c.info.block_sizes.expect("NBD_INFO_BLOCK_SIZE");
    assert_eq!((b.minimum, b.preferred, b.maximum), (1, 4096, 32 << 20));

    // Aligned and unaligned writes, checked through the client and on the
    // device itself.
    let a = pattern(1, 8192, 65536);
    c.write(8192, &a).unwrap();
    let u = pattern(2, 100_001, 9999);
    c.call(Command::Write, command_flags::FUA, 100_001, 9999, &u)
        .unwrap();
    assert_eq!(c.read(8192, 65536).unwrap(), a);
    assert_eq!(c.read(100_001, 9999).unwrap(), u);
    let mut direct = vec![0u8; 4096];
    dev.read_at(2, &mut direct).unwrap();
    assert_eq!(direct, a[..4096]);
    c.call(Command::Flush, 0, 0, 0, &[]).unwrap();

    // WRITE_ZEROES in the middle of the aligned data, TRIM of it all.
    c.call(
        Command::WriteZeroes,
        command_flags::NO_HOLE,
        10_000,
        3000,
        &[],
    )
    .unwrap();
    let got = c.read(8192, 65536).unwrap();
    assert_eq!(got[..1808], a[..1808]);
    assert!(got[1808..4808].iter().all(|&x| x == 0));
    assert_eq!(got[4808..], a[4808..]);
    c.call(Command::Trim, 0, 8192, 65536, &[]).unwrap();
    assert!(
        c.read(8192, 65536).unwrap().iter().all(|&x| x == 0),
        "RamDevice unmap zeroes"
    );

    // Out of range, over the payload limit, unknown command.
    assert_eq!(c.read(4 * MIB - 10, 11), Err(Errno::Inval));
    assert_eq!(c.write(4 * MIB, &[1]), Err(Errno::NoSpc));
    assert_eq!(
        c.call(Command::WriteZeroes, 0, u64::MAX - 5, 10, &[]),
        Err(Errno::NoSpc)
    );
    assert_eq!(
        c.call(Command::Trim, 0, 4 * MIB, 4096, &[]),
        Err(Errno::Inval)
    );
    assert_eq!(c.read(0, (32 << 20) + 1), Err(Errno::Inval));
    assert_eq!(
        c.call(Command::Unknown(200), 0, 0, 0, &[]),
        Err(Errno::Inval)
    );
    // The session still works after the errors.
    assert_eq!(c.read(100_001, 9999).unwrap(), u);
    c.disconnect();
    let s = h.stats();
    assert_eq!((s.sessions, s.protocol_errors), (1, 0));
    h.shutdown();
}

#[test]
fn export_name_with_and_without_zeroes_and_default_name() {
    let (h, _dev) = serve(512, MIB, "named");
    for (name, no_zeroes) in [("", true), ("named", false)] {
        let mut c = Client::export_name(tcp(h.local_addr()), name, no_zeroes);
        assert_eq!(c.info.size, MIB);
        c.write(0, b"hello").unwrap();
        assert_eq!(c.read(0, 5).unwrap(), b"hello");
        c.disconnect();
    }
    // An unknown name in NBD_OPT_GO is an error reply, not a hangup.
    let mut s = tcp(h.local_addr());
    common::greeting(&mut s);
    std::io::Write::write_all(&mut s, &1u32.to_be_bytes()).unwrap();
    common::send_option(&mut s, OptionCode::Go, &[0, 0, 0, 1, b'x', 0, 0]);
    assert_eq!(
        common::read_option_reply(&mut s).0.reply_type,
        ReplyType::ErrUnknown
    );
    common::send_option(&mut s, OptionCode::Abort, &[]);
    assert_eq!(
        common::read_option_reply(&mut s).0.reply_type,
        ReplyType::Ack
    );
    assert_eq!(
        s.read(&mut [0u8; 1]).unwrap(),
        0,
        "closed after NBD_OPT_ABORT"
    );
}

#[test]
fn read_only_export() {
    let dev = Arc::new(RamDevice::new(512, 64));
    dev.write_at(0, &[7u8; 512]).unwrap();
    let export = Export {
        name: "ro".into(),
        device: dev,
        read_only: true,
    };
    let h = Server::bind_tcp("127.0.0.1:0", export)
        .unwrap()
        .spawn()
        .unwrap();
    let mut c = Client::go(tcp(h.local_addr()), "ro");
    assert_ne!(c.info.flags & tf::READ_ONLY, 0);
    assert_eq!(c.write(0, &[1]), Err(Errno::Perm));
    assert_eq!(c.read(0, 512).unwrap(), vec![7u8; 512]);
}

/// Pipelined requests: all sent before any reply is read; replies come
/// back in order with their cookies.
#[test]
fn pipelined_requests() {
    let (h, _dev) = serve(512, 2 * MIB, "");
    let mut c = Client::go(tcp(h.local_addr()), "");
    let mut cookies = Vec::new();
    for i in 0..64u64 {
        cookies.push(c.send(
            Command::Write,
            0,
            i * 4096 + 3,
            4096,
            &pattern(3, i * 4096 + 3, 4096),
        ));
    }
    for &cookie in &cookies {
        assert_eq!(c.recv(0).unwrap(), (cookie, None, vec![]));
    }
    cookies.clear();
    for i in 0..64u64 {
        cookies.push(c.send(Command::Read, 0, i * 4096 + 3, 4096, &[]));
    }
    for (i, &cookie) in cookies.iter().enumerate() {
        let i = i as u64;
        assert_eq!(
            c.recv(4096).unwrap(),
            (cookie, None, pattern(3, i * 4096 + 3, 4096))
        );
    }
}

/// Four connections write interleaved unaligned stripes at once; each
/// connection then reads everything the others wrote.
#[test]
fn multi_conn_interleaved_unaligned_writes() {
    let (h, _dev) = serve(4096, 4 * MIB, "");
    let addr = h.local_addr().clone();
    const STRIPE: u64 = 1000; // not a multiple of the block size
    const STRIPES: u64 = 400;
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let mut c = Client::go(tcp(&addr), "");
                let mut rng = Rng(t + 1);
                let mut order: Vec<u64> = (0..STRIPES).filter(|s| s % 4 == t).collect();
                for i in (1..order.len()).rev() {
                    order.swap(i, rng.below(i as u64 + 1) as usize);
                }
                for s in order {
                    c.write(s * STRIPE, &pattern(9, s * STRIPE, STRIPE as usize))
                        .unwrap();
                }
                c.call(Command::Flush, 0, 0, 0, &[]).unwrap();
                c
            })
        })
        .collect();
    let mut clients: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let total = (STRIPE * STRIPES) as u32;
    for c in &mut clients {
        assert_eq!(c.read(0, total).unwrap(), pattern(9, 0, total as usize));
    }
    assert_eq!(h.stats().active, 4);
}

#[test]
fn unix_socket() {
    let dir = TempDir::new("unix");
    let path = dir.path("nbd.sock");
    let dev = Arc::new(RamDevice::new(512, 2048));
    let h = Server::bind_unix(&path, Export::new("u", dev))
        .unwrap()
        .spawn()
        .unwrap();
    assert_eq!(h.local_addr(), &ListenAddr::Unix(path.clone()));
    assert!(h.uri().starts_with("nbd+unix:///u?socket="));
    let s = UnixStream::connect(&path).unwrap();
    s.set_read_timeout(Some(common::IO_TIMEOUT)).unwrap();
    let mut c = Client::go(s, "u");
    c.write(511, &[1, 2, 3]).unwrap();
    assert_eq!(c.read(510, 5).unwrap(), [0, 1, 2, 3, 0]);
    c.disconnect();
    h.shutdown();
    assert!(!path.exists(), "socket file removed on shutdown");
}

/// Shutdown with one idle session and one client stuck mid-handshake
/// returns, and both clients see the connection close.
#[test]
fn shutdown_closes_connections() {
    let (h, _dev) = serve(512, MIB, "");
    let ListenAddr::Tcp(addr) = h.local_addr().clone() else {
        unreachable!()
    };
    let mut session = Client::go(tcp(h.local_addr()), "");
    session.write(0, &[1]).unwrap();
    let mut stuck = tcp(h.local_addr());
    common::greeting(&mut stuck); // never sends client flags
    h.shutdown();
    assert_eq!(stuck.read(&mut [0u8; 1]).unwrap_or(0), 0);
    assert!(session.recv(0).is_err() || session.s.read(&mut [0u8; 1]).unwrap_or(0) == 0);
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "listener closed"
    );
}

/// A RAM device whose reported size can change (a LUN resized at the
/// target): `blocks` of the `ram`'s blocks are shown.
struct Resizable {
    ram: RamDevice,
    blocks: std::sync::atomic::AtomicU64,
}

impl BlockDevice for Resizable {
    fn block_size(&self) -> u32 {
        self.ram.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.blocks.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn read_at(&self, lba: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.ram.read_at(lba, buf)
    }
    fn write_at(&self, lba: u64, buf: &[u8]) -> std::io::Result<()> {
        self.ram.write_at(lba, buf)
    }
}

#[test]
fn a_resized_device_shows_its_new_size_to_the_next_client() {
    let dev = Arc::new(Resizable {
        ram: RamDevice::new(512, 8192),
        blocks: 2048.into(),
    });
    let h = Server::bind_tcp("127.0.0.1:0", Export::new("lun", dev.clone()))
        .unwrap()
        .spawn()
        .unwrap();
    let mut before = Client::go(tcp(h.local_addr()), "lun");
    assert_eq!(before.info.size, MIB);
    dev.blocks.store(8192, std::sync::atomic::Ordering::SeqCst);
    let mut after = Client::go(tcp(h.local_addr()), "lun");
    assert_eq!(after.info.size, 4 * MIB);
    let p = pattern(3, 3 * MIB, 4096);
    after.write(3 * MIB, &p).unwrap();
    assert_eq!(after.read(3 * MIB, 4096).unwrap(), p);
    // The first client's requests are checked against the device's size
    // now too: its old end is no longer a limit.
    assert_eq!(before.read(3 * MIB, 4096).unwrap(), p);
    before.disconnect();
    after.disconnect();
    h.shutdown();
}

/// A RAM device whose reads wait while `held` (a LUN whose target
/// stopped answering) and fail while `broken`.
struct Holds {
    ram: RamDevice,
    held: std::sync::atomic::AtomicBool,
    broken: std::sync::atomic::AtomicBool,
}

impl BlockDevice for Holds {
    fn block_size(&self) -> u32 {
        self.ram.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.ram.num_blocks()
    }
    fn read_at(&self, lba: u64, buf: &mut [u8]) -> std::io::Result<()> {
        while self.held.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if self.broken.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(std::io::Error::other("medium error"));
        }
        self.ram.read_at(lba, buf)
    }
    fn write_at(&self, lba: u64, buf: &[u8]) -> std::io::Result<()> {
        self.ram.write_at(lba, buf)
    }
}

/// The counters say what the clients asked for (requests, reads and
/// writes with their bytes, device errors) and what waits on the device;
/// a bounded shutdown with a read held by the device gives up on it in
/// time, says so, and still closes the client's connection; one with
/// nothing held joins everything.
#[test]
fn stats_and_a_bounded_shutdown_with_a_read_the_device_holds() {
    use std::sync::atomic::Ordering::SeqCst;
    use std::time::{Duration, Instant};
    let dev = Arc::new(Holds {
        ram: RamDevice::new(512, 2048),
        held: false.into(),
        broken: false.into(),
    });
    let mut h = Server::bind_tcp("127.0.0.1:0", Export::new("", dev.clone()))
        .unwrap()
        .spawn()
        .unwrap();
    let mut c = Client::go(tcp(h.local_addr()), "");
    c.write(0, &pattern(4, 0, 8192)).unwrap();
    assert_eq!(c.read(100, 1000).unwrap(), pattern(4, 100, 1000));
    c.call(Command::Flush, 0, 0, 0, &[]).unwrap();
    assert_eq!(c.read(MIB, 1), Err(Errno::Inval), "refused: no device call");
    dev.broken.store(true, SeqCst);
    assert_eq!(c.read(0, 512), Err(Errno::Io));
    dev.broken.store(false, SeqCst);
    let s = h.stats();
    assert_eq!(s.requests, 5, "{s:?}");
    assert_eq!((s.io.reads, s.io.read_bytes), (1, 1000), "{s:?}");
    assert_eq!((s.io.writes, s.io.written_bytes), (1, 8192), "{s:?}");
    assert_eq!((s.io.errors, s.io.in_flight), (1, 0), "{s:?}");

    // A read the device holds, and a request behind it that is never
    // taken.
    dev.held.store(true, SeqCst);
    c.send(Command::Read, 0, 4096, 512, &[]);
    c.send(Command::Read, 0, 0, 512, &[]);
    let end = Instant::now() + Duration::from_secs(10);
    while h.stats().io.in_flight == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(h.stats().io.in_flight, 1);
    let t0 = Instant::now();
    let busy = h.shutdown_within(Duration::from_millis(100)).unwrap_err();
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert_eq!(busy.connections, 1);
    assert_eq!(
        busy.to_string(),
        "1 NBD connections still inside a device call 100 ms after the shutdown began"
    );
    let s = h.stats();
    assert_eq!((s.active, s.requests, s.io.in_flight), (1, 6, 1), "{s:?}");
    // The client is cut off, not left waiting on the device.
    c.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(c.s.read(&mut [0u8; 1]).unwrap_or(0), 0);
    assert!(h.shutdown_within(Duration::ZERO).is_ok(), "done already");
    // The device answers again: the thread left behind ends by itself.
    dev.held.store(false, SeqCst);
    let end = Instant::now() + Duration::from_secs(10);
    while h.stats().active > 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(h.stats().active, 0);
    drop(h);

    // Nothing held: every connection ends in time and is joined.
    let mut h = Server::bind_tcp("127.0.0.1:0", Export::new("", dev))
        .unwrap()
        .spawn()
        .unwrap();
    let mut idle = Client::go(tcp(h.local_addr()), "");
    idle.write(0, &[1]).unwrap();
    assert_eq!(h.shutdown_within(Duration::from_millis(500)), Ok(()));
    assert_eq!(h.stats().active, 0);
    assert_eq!(idle.s.read(&mut [0u8; 1]).unwrap_or(0), 0);
}
