//! Sockets and threads around [`Handshake`] and [`Transmission`].
//!
//! One acceptor thread and one thread per connection (at most
//! [`MAX_CONNECTIONS`]). A connection reads requests through a buffer and
//! answers them in order; replies are flushed only when the buffer holds
//! no complete next request, so pipelined requests share one `write`.
//! [`ServerHandle::shutdown`] stops the acceptor (waking it with a
//! connection of its own), shuts down every client socket, which ends the
//! blocked reads, and joins all threads; a connection takes no further
//! request once it has begun. [`ServerHandle::shutdown_within`] waits for
//! the connections only so long, and leaves behind those inside a device
//! call that does not return (a device that stopped answering).

use crate::handshake::{ExportInfo, Handshake, Step, MAX_OPTIONS};
use crate::transmission::{Outcome, Transmission};
use crate::volume::Volume;
use crate::wire::{Command, Request, RequestRepr};
use crate::Hangup;
use blockload::counts::IoStats;
use blockload::BlockDevice;
use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most connections served at once; more are closed on accept.
pub const MAX_CONNECTIONS: usize = 256;
/// A client must finish the handshake within this time.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
const BUFFER: usize = 256 * 1024;
/// Largest request or reply buffer kept between requests.
const KEEP: usize = 8 << 20;

/// The one export a server offers.
#[derive(Clone)]
pub struct Export {
    /// Its name; the default name `""` reaches it too.
    pub name: String,
    /// The backing device.
    pub device: Arc<dyn BlockDevice>,
    /// Refuse writes with `NBD_EPERM` and advertise `NBD_FLAG_READ_ONLY`.
    pub read_only: bool,
}

impl Export {
    /// A writable export.
    pub fn new(name: impl Into<String>, device: Arc<dyn BlockDevice>) -> Export {
        Export {
            name: name.into(),
            device,
            read_only: false,
        }
    }
}

/// Where a server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// A TCP address.
    Tcp(SocketAddr),
    /// A Unix socket path.
    Unix(PathBuf),
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Tcp(a) => write!(f, "{a}"),
            ListenAddr::Unix(p) => write!(f, "{}", p.display()),
        }
    }
}

/// Counters of a running server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Connections accepted.
    pub accepted: u64,
    /// Connections open now.
    pub active: u64,
    /// Sessions that reached the transmission phase.
    pub sessions: u64,
    /// Connections the server hung up on because of bad input.
    pub protocol_errors: u64,
    /// Requests of the transmission phase taken (every command but
    /// `NBD_CMD_DISC`, also those refused).
    pub requests: u64,
    /// What the requests read and wrote, the device errors, and the
    /// requests inside a device call now.
    pub io: IoStats,
}

/// Connections still inside a device call when
/// [`ServerHandle::shutdown_within`] stopped waiting for them: the device
/// does not answer. Their threads were left running (each ends when its
/// call returns); the device must not be torn down under them, so the
/// caller's way out is to exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{connections} NBD connections still inside a device call {} ms after the shutdown began", waited.as_millis())]
pub struct Busy {
    /// Connections left running.
    pub connections: usize,
    /// How long the shutdown waited for them.
    pub waited: Duration,
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    fn shutdown(&self) {
        // Errors mean the socket is already gone, which is the goal.
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }

    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

struct Shared {
    info: ExportInfo,
    /// What the export serves (its size read at each handshake).
    volume: Arc<Volume>,
    transmission: Transmission,
    stop: AtomicBool,
    conns: Mutex<Conns>,
    /// Notified as a connection leaves [`Conns::open`].
    closed: Condvar,
    accepted: AtomicU64,
    sessions: AtomicU64,
    protocol_errors: AtomicU64,
    requests: AtomicU64,
}

#[derive(Default)]
struct Conns {
    next: u64,
    /// The connections being served, by id; each leaves as its thread
    /// ends.
    open: HashMap<u64, Stream>,
    threads: Vec<(u64, JoinHandle<()>)>,
}

impl Shared {
    fn conns(&self) -> std::sync::MutexGuard<'_, Conns> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A bound, not yet serving, NBD server.
pub struct Server {
    listener: Listener,
    addr: ListenAddr,
    shared: Arc<Shared>,
}

impl Server {
    /// Binds a TCP listener (use port 0 for any free port).
    ///
    /// # Errors
    /// Bind errors, or a device whose geometry cannot be exported.
    pub fn bind_tcp(addr: impl ToSocketAddrs, export: Export) -> io::Result<Server> {
        let listener = TcpListener::bind(addr)?;
        let addr = ListenAddr::Tcp(listener.local_addr()?);
        Server::new(Listener::Tcp(listener), addr, export)
    }

    /// Binds a Unix socket at `path`, which must not exist; it is removed
    /// again by [`ServerHandle::shutdown`].
    ///
    /// # Errors
    /// Bind errors, or a device whose geometry cannot be exported.
    pub fn bind_unix(path: impl AsRef<Path>, export: Export) -> io::Result<Server> {
        let path = path.as_ref().to_path_buf();
        let listener = UnixListener::bind(&path)?;
        Server::new(Listener::Unix(listener), ListenAddr::Unix(path), export)
    }

    fn new(listener: Listener, addr: ListenAddr, export: Export) -> io::Result<Server> {
        if export.name.len() > crate::wire::MAX_STRING || export.name.contains('\0') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "export name over 4096 bytes or with NUL",
            ));
        }
        let volume = Arc::new(Volume::new(export.device)?);
        let transmission = Transmission::new(volume.clone(), export.read_only);
        let info = ExportInfo {
            name: export.name,
            size: volume.size(),
            flags: transmission.flags(),
            block_sizes: transmission.block_sizes(),
        };
        let shared = Arc::new(Shared {
            info,
            volume,
            transmission,
            stop: AtomicBool::new(false),
            conns: Mutex::new(Conns::default()),
            closed: Condvar::new(),
            accepted: AtomicU64::new(0),
            sessions: AtomicU64::new(0),
            protocol_errors: AtomicU64::new(0),
            requests: AtomicU64::new(0),
        });
        Ok(Server {
            listener,
            addr,
            shared,
        })
    }

    /// Where the server listens (the real port when bound to port 0).
    pub fn local_addr(&self) -> &ListenAddr {
        &self.addr
    }

    /// Serves on this thread until the process ends.
    ///
    /// # Errors
    /// An accept error that is not transient.
    pub fn serve_forever(self) -> io::Result<()> {
        accept_loop(&self.listener, &self.shared)
    }

    /// Serves on a background thread.
    ///
    /// # Errors
    /// Thread creation failure.
    pub fn spawn(self) -> io::Result<ServerHandle> {
        let Server {
            listener,
            addr,
            shared,
        } = self;
        let s = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name("nbd-accept".into())
            .spawn(move || {
                let _ = accept_loop(&listener, &s);
            })?;
        Ok(ServerHandle {
            addr,
            shared,
            acceptor: Some(acceptor),
        })
    }
}

/// A server running on background threads; dropping it shuts it down.
pub struct ServerHandle {
    addr: ListenAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl ServerHandle {
    /// Where the server listens.
    pub fn local_addr(&self) -> &ListenAddr {
        &self.addr
    }

    /// The NBD URI of the export (`nbd://host:port/name` or
    /// `nbd+unix:///name?socket=path`), for qemu-img, nbdinfo and fio.
    pub fn uri(&self) -> String {
        let name = percent_encode(&self.shared.info.name);
        match &self.addr {
            ListenAddr::Tcp(a) => format!("nbd://{a}/{name}"),
            ListenAddr::Unix(p) => format!(
                "nbd+unix:///{name}?socket={}",
                percent_encode(&p.to_string_lossy())
            ),
        }
    }

    /// Current counters.
    pub fn stats(&self) -> Stats {
        Stats {
            accepted: self.shared.accepted.load(Ordering::Relaxed),
            active: self.shared.conns().open.len() as u64,
            sessions: self.shared.sessions.load(Ordering::Relaxed),
            protocol_errors: self.shared.protocol_errors.load(Ordering::Relaxed),
            requests: self.shared.requests.load(Ordering::Relaxed),
            io: self.shared.volume.stats(),
        }
    }

    /// Stops accepting, closes every connection and joins all threads.
    /// A thread inside a device call finishes that call first.
    pub fn shutdown(mut self) {
        self.stop(None);
    }

    /// Stops accepting and closes every connection as
    /// [`ServerHandle::shutdown`] does, but waits at most `limit` for the
    /// connection threads. Afterwards [`ServerHandle::stats`] holds what
    /// was served (`active`: the connections left behind). Later calls,
    /// and dropping the handle, do nothing more.
    ///
    /// # Errors
    /// [`Busy`] when connections are still inside a device call at
    /// `limit`; their threads keep the device until their calls return.
    pub fn shutdown_within(&mut self, limit: Duration) -> Result<(), Busy> {
        match self.stop(Some(limit)) {
            0 => Ok(()),
            connections => Err(Busy {
                connections,
                waited: limit,
            }),
        }
    }

    /// Stops the server, waiting at most `limit` (or as long as it takes)
    /// for the connection threads; returns how many were left running.
    fn stop(&mut self, limit: Option<Duration>) -> usize {
        let Some(acceptor) = self.acceptor.take() else {
            return 0;
        };
        let end = limit.map(|l| Instant::now() + l);
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the blocked accept(); it sees `stop` and returns.
        let _ = match &self.addr {
            ListenAddr::Tcp(a) => {
                let mut a = *a;
                if a.ip().is_unspecified() {
                    a.set_ip(if a.is_ipv4() {
                        [127, 0, 0, 1].into()
                    } else {
                        std::net::Ipv6Addr::LOCALHOST.into()
                    });
                }
                TcpStream::connect(a).map(drop)
            }
            ListenAddr::Unix(p) => UnixStream::connect(p).map(drop),
        };
        let _ = acceptor.join();
        let mut conns = self.shared.conns();
        for s in conns.open.values() {
            s.shutdown();
        }
        if let Some(end) = end {
            while !conns.open.is_empty() {
                let left = end.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                conns = self
                    .shared
                    .closed
                    .wait_timeout(conns, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        }
        // Those still open are inside a device call: left behind when
        // there is a limit (dropping a JoinHandle detaches its thread).
        let (stuck, done): (Vec<_>, Vec<_>) = std::mem::take(&mut conns.threads)
            .into_iter()
            .partition(|(id, _)| end.is_some() && conns.open.contains_key(id));
        drop(conns);
        for (_, t) in done {
            let _ = t.join();
        }
        if let ListenAddr::Unix(p) = &self.addr {
            let _ = std::fs::remove_file(p);
        }
        stuck.len()
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop(None);
    }
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn accept_loop(listener: &Listener, shared: &Arc<Shared>) -> io::Result<()> {
    while !shared.stop.load(Ordering::SeqCst) {
        let accepted = match listener {
            Listener::Tcp(l) => l.accept().map(|(s, _)| {
                let _ = s.set_nodelay(true);
                Stream::Tcp(s)
            }),
            Listener::Unix(l) => l.accept().map(|(s, _)| Stream::Unix(s)),
        };
        let stream = match accepted {
            Ok(s) => s,
            Err(e) if is_transient(&e) => continue,
            Err(e) => return Err(e),
        };
        let mut conns = shared.conns();
        // Checked under the lock: shutdown takes it after setting `stop`,
        // so no connection is registered after the sweep.
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        shared.accepted.fetch_add(1, Ordering::Relaxed);
        reap(&mut conns);
        if conns.open.len() >= MAX_CONNECTIONS {
            continue; // dropping `stream` closes it
        }
        let Ok(registered) = stream.try_clone() else {
            continue;
        };
        let id = conns.next;
        conns.next += 1;
        conns.open.insert(id, registered);
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("nbd-conn-{id}"))
            .spawn(move || {
                let end = serve_connection(stream, &s);
                if matches!(end, Ok(Some(ref h)) if !h.is_clean()) {
                    s.protocol_errors.fetch_add(1, Ordering::Relaxed);
                }
                s.conns().open.remove(&id);
                s.closed.notify_all();
            });
        match spawned {
            Ok(t) => conns.threads.push((id, t)),
            Err(_) => {
                conns.open.remove(&id);
            }
        }
    }
    Ok(())
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted | io::ErrorKind::WouldBlock
    )
}

/// Joins finished connection threads so the list stays short.
fn reap(conns: &mut Conns) {
    let (done, running): (Vec<_>, Vec<_>) = std::mem::take(&mut conns.threads)
        .into_iter()
        .partition(|(_, t)| t.is_finished());
    conns.threads = running;
    for (_, t) in done {
        let _ = t.join();
    }
}

/// Serves one connection; `Ok(None)` when the client closed the socket,
/// `Ok(Some(h))` when the session ended with `h`.
fn serve_connection(stream: Stream, shared: &Shared) -> io::Result<Option<Hangup>> {
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let mut r = BufReader::with_capacity(BUFFER, stream.try_clone()?);
    let mut w = BufWriter::with_capacity(BUFFER, stream.try_clone()?);
    let mut out = Vec::new();
    let mut input = Vec::new();
    // The size as the device says it now: a LUN resized at the target
    // is its new size to every client that connects after (NBD cannot
    // tell a connected client, proto.md has no resize notice).
    let info = ExportInfo {
        size: shared.volume.size(),
        ..shared.info.clone()
    };
    let mut hs = Handshake::new(info, &mut out);
    w.write_all(&out)?;
    w.flush()?;
    // Client flags, then at most MAX_OPTIONS headers and data blocks.
    let mut entered = false;
    for _ in 0..2 * MAX_OPTIONS + 2 {
        let Some(n) = hs.want() else { break };
        input.resize(n, 0);
        if let Err(e) = r.read_exact(&mut input) {
            return eof_or(e);
        }
        out.clear();
        let step = hs.handle(&input, &mut out);
        w.write_all(&out)?;
        w.flush()?;
        match step {
            Step::Continue => {}
            Step::Transmission => {
                entered = true;
                break;
            }
            Step::Close(h) => return Ok(Some(h)),
        }
    }
    if !entered {
        return Ok(Some(Hangup::TooManyOptions));
    }
    shared.sessions.fetch_add(1, Ordering::Relaxed);
    stream.set_read_timeout(None)?;
    let mut header = [0u8; Request::<&[u8]>::LEN];
    // Ends when the client disconnects, errs, or the server stops (which
    // shuts the socket down; requests already buffered are not served).
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return Ok(None);
        }
        if r.buffer().len() < header.len() {
            w.flush()?;
        }
        if let Err(e) = r.read_exact(&mut header) {
            w.flush()?;
            return eof_or(e);
        }
        let Ok(req) = RequestRepr::parse(&Request::new_unchecked(&header[..])) else {
            w.flush()?;
            return Ok(Some(Hangup::BadMagic));
        };
        let n = match shared.transmission.payload_len(&req) {
            Ok(n) => n,
            Err(h) => {
                w.flush()?;
                return Ok(Some(h));
            }
        };
        if r.buffer().len() < n {
            w.flush()?;
        }
        input.resize(n, 0);
        if let Err(e) = r.read_exact(&mut input) {
            w.flush()?;
            return eof_or(e);
        }
        out.clear();
        if req.command != Command::Disc {
            shared.requests.fetch_add(1, Ordering::Relaxed);
        }
        if shared.transmission.execute(&req, &input, &mut out) == Outcome::Disconnect {
            w.flush()?;
            return Ok(Some(Hangup::Disconnected));
        }
        w.write_all(&out)?;
        // Keep buffers for common sizes, not a 32 MiB one per connection.
        if out.capacity() > KEEP {
            out = Vec::new();
        }
        if input.capacity() > KEEP {
            input = Vec::new();
        }
    }
}

fn eof_or(e: io::Error) -> io::Result<Option<Hangup>> {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        Ok(None)
    } else {
        Err(e)
    }
}
