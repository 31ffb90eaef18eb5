//! A small blocking NBD client built from the crate's wire types, and
//! helpers for tests that run external tools.
#![allow(dead_code)]

use nbd::wire::{
    client_flags, BlockSizes, Command, Errno, ExportNameReplyRepr, GoRepr, Greeting, GreetingRepr,
    InfoRepr, InfoType, OptionCode, OptionHeader, OptionHeaderRepr, OptionReply, OptionReplyRepr,
    ReplyType, Request, RequestRepr, SimpleReply, SimpleReplyRepr,
};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command as Process;
use std::time::Duration;

/// Safety net against a server bug hanging a test; never used to wait.
pub const IO_TIMEOUT: Duration = Duration::from_secs(20);

pub fn tcp(addr: &nbd::ListenAddr) -> TcpStream {
    let nbd::ListenAddr::Tcp(a) = addr else {
        panic!("not TCP")
    };
    let s = TcpStream::connect(a).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    // Header and payload go out in two writes; without this, Nagle holds
    // the second until the server's delayed ACK.
    s.set_nodelay(true).unwrap();
    s
}

/// Reads the greeting; checks it.
pub fn greeting(s: &mut impl Read) -> u16 {
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    GreetingRepr::parse(&Greeting::new_checked(&g[..]).unwrap())
        .unwrap()
        .flags
}

pub fn send_option(s: &mut impl Write, option: OptionCode, data: &[u8]) {
    let mut h = [0u8; 16];
    OptionHeaderRepr {
        option,
        length: data.len() as u32,
    }
    .emit(&mut OptionHeader::new_unchecked(&mut h[..]));
    s.write_all(&h).unwrap();
    s.write_all(data).unwrap();
}

pub fn read_option_reply(s: &mut impl Read) -> (OptionReplyRepr, Vec<u8>) {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).unwrap();
    let r = OptionReplyRepr::parse(&OptionReply::new_checked(&h[..]).unwrap()).unwrap();
    let mut data = vec![0u8; r.length as usize];
    s.read_exact(&mut data).unwrap();
    (r, data)
}

/// What NBD_OPT_GO told the client.
#[derive(Debug, Default)]
pub struct Negotiated {
    pub size: u64,
    pub flags: u16,
    pub block_sizes: Option<BlockSizes>,
}

pub struct Client<S: Read + Write> {
    pub s: S,
    pub info: Negotiated,
    next_cookie: u64,
}

impl<S: Read + Write> Client<S> {
    /// Handshake with NBD_OPT_GO; panics on any failure.
    pub fn go(mut s: S, name: &str) -> Client<S> {
        greeting(&mut s);
        s.write_all(&(client_flags::FIXED_NEWSTYLE | client_flags::NO_ZEROES).to_be_bytes())
            .unwrap();
        Client::resume_go(s, name)
    }

    /// NBD_OPT_GO on a stream already past the client flags.
    pub fn resume_go(mut s: S, name: &str) -> Client<S> {
        let mut data = Vec::new();
        GoRepr {
            name: name.into(),
            requests: vec![InfoType::BlockSize],
        }
        .emit(&mut data);
        send_option(&mut s, OptionCode::Go, &data);
        let mut info = Negotiated::default();
        for _ in 0..8 {
            let (r, data) = read_option_reply(&mut s);
            assert_eq!(r.option, OptionCode::Go);
            match r.reply_type {
                ReplyType::Ack => {
                    return Client {
                        s,
                        info,
                        next_cookie: 1,
                    }
                }
                ReplyType::Info => match InfoRepr::parse(&data).unwrap() {
                    InfoRepr::Export { size, flags } => (info.size, info.flags) = (size, flags),
                    InfoRepr::BlockSize(b) => info.block_sizes = Some(b),
                    _ => {}
                },
                other => panic!(
                    "NBD_OPT_GO failed: {other}: {}",
                    String::from_utf8_lossy(&data)
                ),
            }
        }
        panic!("too many replies to NBD_OPT_GO");
    }

    /// Handshake with NBD_OPT_EXPORT_NAME, with or without NO_ZEROES.
    pub fn export_name(mut s: S, name: &str, no_zeroes: bool) -> Client<S> {
        greeting(&mut s);
        let mut flags = client_flags::FIXED_NEWSTYLE;
        if no_zeroes {
            flags |= client_flags::NO_ZEROES;
        }
        s.write_all(&flags.to_be_bytes()).unwrap();
        send_option(&mut s, OptionCode::ExportName, name.as_bytes());
        let mut reply = vec![0u8; if no_zeroes { 10 } else { 134 }];
        s.read_exact(&mut reply).unwrap();
        let r = ExportNameReplyRepr::parse(&reply).unwrap();
        Client {
            s,
            info: Negotiated {
                size: r.size,
                flags: r.flags,
                block_sizes: None,
            },
            next_cookie: 1,
        }
    }

    /// Sends one request; returns its cookie.
    pub fn send(
        &mut self,
        command: Command,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> u64 {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let mut h = [0u8; 28];
        RequestRepr {
            flags,
            command,
            cookie,
            offset,
            length,
        }
        .emit(&mut Request::new_unchecked(&mut h[..]));
        self.s.write_all(&h).unwrap();
        self.s.write_all(payload).unwrap();
        cookie
    }

    /// Reads one simple reply; `data_len` bytes follow a successful one.
    pub fn recv(&mut self, data_len: usize) -> io::Result<(u64, Option<Errno>, Vec<u8>)> {
        let mut h = [0u8; 16];
        self.s.read_exact(&mut h)?;
        let r = SimpleReplyRepr::parse(&SimpleReply::new_checked(&h[..]).unwrap()).unwrap();
        let mut data = Vec::new();
        if r.error.is_none() {
            data.resize(data_len, 0);
            self.s.read_exact(&mut data)?;
        }
        Ok((r.cookie, r.error, data))
    }

    /// One request and its reply.
    pub fn call(
        &mut self,
        command: Command,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> Result<Vec<u8>, Errno> {
        let cookie = self.send(command, flags, offset, length, payload);
        let data_len = if command == Command::Read {
            length as usize
        } else {
            0
        };
        let (c, error, data) = self.recv(data_len).unwrap();
        assert_eq!(c, cookie);
        match error {
            None => Ok(data),
            Some(e) => Err(e),
        }
    }

    pub fn read(&mut self, offset: u64, length: u32) -> Result<Vec<u8>, Errno> {
        self.call(Command::Read, 0, offset, length, &[])
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), Errno> {
        self.call(Command::Write, 0, offset, data.len() as u32, data)
            .map(drop)
    }

    /// Sends NBD_CMD_DISC and checks the server closes.
    pub fn disconnect(mut self) {
        self.send(Command::Disc, 0, 0, 0, &[]);
        let mut rest = Vec::new();
        self.s.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "no reply to NBD_CMD_DISC");
    }
}

/// Every byte's value is a function of its offset and a seed, so a
/// misplaced or stale byte shows.
pub fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let x = (offset + i).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed;
            (x >> 29) as u8 ^ (x >> 7) as u8
        })
        .collect()
}

/// A pseudo-random generator with a fixed seed (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A scratch directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("nbd-test-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// True if `tool` is installed; otherwise the test is skipped, or fails
/// under `CI=true` (`rdma_testkit::need`).
pub fn have(tool: &str) -> bool {
    rdma_testkit::need::tool(tool)
}

/// Runs a tool; panics with its output unless it succeeds.
pub fn run(tool: &str, args: &[&str]) -> String {
    let out = Process::new(tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{tool} {args:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

pub fn write_file(path: &Path, data: &[u8]) {
    std::fs::write(path, data).unwrap();
}
