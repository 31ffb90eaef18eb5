//! rperf's baseline (`--baseline`): the same bytes over a plain UDP
//! socket pair (plain TCP for a test on our soft iWARP NIC) in the same run, with the same checks on the receiving
//! side (the floor sink), so a ratio against it means something.

use super::*;

/// How long the plain-UDP baseline blasts.
pub(super) const BASELINE_SECS: f64 = 2.0;

/// Datagrams the baseline offers the kernel per `sendmmsg`.
pub(super) const BASELINE_BATCH: usize = 64;

/// What the baseline's receiver does with each datagram.
pub(super) struct Sink {
    /// The floor: the region each payload is copied into, in turn.
    pub(super) region: Option<Vec<u8>>,
    pub(super) at: usize,
    pub(super) bad_crcs: u64,
}

impl Sink {
    pub(super) fn new(floor: bool, region: usize) -> Sink {
        Sink {
            region: floor.then(|| vec![0u8; region.clamp(1 << 16, 1 << 30)]),
            at: 0,
            bad_crcs: 0,
        }
    }

    /// The floor's per-datagram work: the CRC-32 over everything before
    /// the last 4 bytes must equal them, and the rest lands in place.
    /// Returns the payload bytes the datagram delivered.
    pub(super) fn take(&mut self, d: &[u8]) -> u64 {
        let Some(region) = self.region.as_mut() else {
            return d.len() as u64;
        };
        let Some((payload, crc)) = d.split_last_chunk::<4>() else {
            self.bad_crcs += 1;
            return 0;
        };
        if crc32fast::hash(payload) != u32::from_le_bytes(*crc) {
            self.bad_crcs += 1;
            return 0;
        }
        if self.at + payload.len() > region.len() {
            self.at = 0;
        }
        let n = payload.len().min(region.len());
        region[self.at..self.at + n].copy_from_slice(&payload[..n]);
        self.at += n;
        n as u64
    }
}

/// Counts datagrams until the client's TCP line says stop. It receives as
/// our node does (the same socket options, `recvmmsg` batches, GRO), so the
/// baseline is plain UDP with the same tools, not a slower reader.
pub(super) fn baseline_sink(
    addr: SocketAddr,
    reader: &mut BufReader<TcpStream>,
    mut sink: Sink,
) -> Result<Control, PerfError> {
    let mut sock = roce_udp::RoceSocket::bind(addr)?;
    let (mut datagrams, mut bytes) = (0u64, 0u64);
    let start = StdInstant::now();
    let mut busy_cpu = 0.0;
    loop {
        let cpu0 = thread_cpu_seconds();
        let mut calls = 0;
        for _ in 0..64 {
            let n = sock.recv_batch(64, |_, d| {
                datagrams += 1;
                bytes += sink.take(d);
            });
            if n == 0 {
                break;
            }
            calls += n;
        }
        if calls == 0 {
            // Idle: block until a datagram or 5 ms pass, then look at TCP.
            let _ = sock.wait(None, std::time::Duration::from_millis(5));
        } else {
            // Up to 64 batches between two clock reads: measured always.
            busy_cpu += thread_cpu_seconds() - cpu0;
        }
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(n) if n > 0 => break,
            Ok(_) => return Err(PerfError::Protocol("peer left during the baseline".into())),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
        if start.elapsed() > std::time::Duration::from_secs(60) {
            return Err(PerfError::Protocol("baseline never ended".into()));
        }
    }
    Ok(Control::BaselineResult {
        datagrams: datagrams - sink.bad_crcs,
        bytes,
        cpu_seconds: Some(busy_cpu),
    })
}

/// What one plain-UDP phase of `--baseline` measured.
pub(super) struct UdpPhase {
    pub(super) gbit_per_s: f64,
    pub(super) pkt_per_s: f64,
    pub(super) client_cpu_ns_per_byte: f64,
    pub(super) server_cpu_ns_per_byte: Option<f64>,
}

/// Blasts MTU-sized datagrams at the server's sink for `BASELINE_SECS`
/// and collects its count. Sent as our node sends: batches through
/// `sendmmsg`, runs of equal datagrams as one segmented (GSO) send, from a
/// region as large as the one our test sends from (`region` bytes, walked
/// in order), so the kernel's copy reads as much memory as it does for
/// our node. With `floor`, each datagram also carries a CRC-32 of its
/// payload, computed as it is sent, which the sink checks before copying
/// the payload into place: the per-byte work no RoCE NIC in user space
/// can leave out (the ICRC at both ends, and delivery into the memory
/// region), with none of the transport's.
///
/// With `shape` (the test's message size), the datagrams of each message
/// are sized as a RoCE NIC sends it: the first 16 bytes longer than the
/// rest (a WRITE's RETH), the last 16 shorter, so the message's bytes
/// stay the same. Grouped as our node groups them, such a message takes
/// two segmented sends where equal datagrams take one (a send carries at
/// most 65,000 bytes, and a shorter datagram ends it): the floor in the
/// packet shape of a WRITE, whose cost per send the plain floor does not
/// pay.
#[allow(clippy::too_many_arguments)]
pub(super) fn udp_phase(
    common: &Common,
    region: usize,
    dst: SocketAddr,
    floor: bool,
    shape: Option<usize>,
    reader: &mut BufReader<TcpStream>,
    writer: &mut TcpStream,
) -> Result<UdpPhase, PerfError> {
    send_line(
        writer,
        &Control::Baseline {
            port: dst.port(),
            floor,
            region,
        },
    )?;
    let mut sock = roce_udp::RoceSocket::bind(SocketAddr::new(common.bind.ip(), 0))?;
    let mtu = common.mtu.bytes();
    let chunks = region.div_ceil(mtu).max(BASELINE_BATCH);
    let data: Vec<u8> = (0..chunks * mtu).map(pattern).collect();
    let mut datagrams = Vec::new();
    let mut at = 0;
    for len in datagram_lens(data.len(), mtu, shape) {
        datagrams.push(&data[at..at + len]);
        at += len;
    }
    let batches: Vec<Vec<&[u8]>> = datagrams
        .chunks(BASELINE_BATCH)
        .map(<[&[u8]]>::to_vec)
        .collect();
    let tail_len = if floor { 4 } else { 0 };
    let runs: Vec<_> = batches
        .iter()
        .map(|b| {
            let lens: Vec<_> = b.iter().map(|d| (dst, d.len() + tail_len)).collect();
            sock.gso_runs_by_len(&lens)
        })
        .collect();
    let mut tails = vec![[0u8; 4]; BASELINE_BATCH];
    let t0 = StdInstant::now();
    let cpu0 = thread_cpu_seconds();
    let blast = std::time::Duration::from_secs_f64(BASELINE_SECS);
    let mut next = 0;
    while t0.elapsed() < blast {
        let batch = &batches[next];
        if floor {
            for (t, d) in tails.iter_mut().zip(batch) {
                *t = crc32fast::hash(d).to_le_bytes();
            }
        }
        let parts: Vec<[&[u8]; 2]> = batch
            .iter()
            .zip(&tails)
            .map(|(d, t)| [*d, &t[..tail_len]])
            .collect();
        let vectored: Vec<(SocketAddr, &[&[u8]])> = parts.iter().map(|p| (dst, &p[..])).collect();
        // A full socket buffer takes part of the batch; refusals while
        // the sink binds are simply not counted.
        let _ = sock.send_runs_vectored(&vectored, &runs[next]);
        next = (next + 1) % batches.len();
    }
    let sender_cpu = thread_cpu_seconds() - cpu0;
    // Datagrams carry `mtu` bytes of data on average in either shape.
    let sent_bytes = sock.stats().sent * mtu as u64;
    std::thread::sleep(std::time::Duration::from_millis(50));
    send_line(writer, &Control::Done)?;
    reader.get_mut().set_nonblocking(false)?;
    match read_line::<Control>(reader)? {
        Control::BaselineResult {
            datagrams,
            bytes,
            cpu_seconds,
        } => {
            let secs = BASELINE_SECS;
            Ok(UdpPhase {
                gbit_per_s: bytes as f64 * 8.0 / secs / 1e9,
                pkt_per_s: datagrams as f64 / secs,
                client_cpu_ns_per_byte: per_byte_ns(sender_cpu, sent_bytes),
                server_cpu_ns_per_byte: cpu_seconds.map(|c| per_byte_ns(c, bytes)),
            })
        }
        other => Err(PerfError::Protocol(format!(
            "expected baseline result, got {other:?}"
        ))),
    }
}

/// The lengths `total` bytes of data are sent in (before the CRC): `mtu`
/// each, the last shorter; with `shape` (a message size of at least two
/// datagrams, the last over 16 bytes) each message's first 16 bytes
/// longer and its last 16 shorter (see [`udp_phase`]), and what is left
/// after whole messages as without. They add up to `total`.
fn datagram_lens(total: usize, mtu: usize, shape: Option<usize>) -> Vec<usize> {
    let plain = |n: usize| -> Vec<usize> {
        let mut v = vec![mtu; n / mtu];
        if !n.is_multiple_of(mtu) {
            v.push(n % mtu);
        }
        v
    };
    let shaped = |&m: &usize| m > mtu && m - (m.div_ceil(mtu) - 1) * mtu > 16;
    let Some(msg) = shape.filter(shaped) else {
        return plain(total);
    };
    let mut one = plain(msg);
    let last = one.len() - 1;
    one[0] += 16;
    one[last] -= 16;
    let mut lens = Vec::new();
    for _ in 0..total / msg {
        lens.extend_from_slice(&one);
    }
    lens.extend(plain(total % msg));
    lens
}

/// The plain-TCP baseline of a test on our soft iWARP NIC: the client
/// connects from its address to the server's (`dst`) and writes `chunk`
/// bytes at a time from a region of `region` bytes, walked in order, for
/// `BASELINE_SECS`; the server reads each chunk into a region as large
/// (the copy into place iWARP's placement does too) until the stream
/// ends, then answers with the bytes it took. The rate is those bytes
/// over the time from the first write to that answer.
pub(super) fn tcp_phase(
    common: &Common,
    region: usize,
    chunk: usize,
    dst: SocketAddr,
    reader: &mut BufReader<TcpStream>,
    writer: &mut TcpStream,
) -> Result<UdpPhase, PerfError> {
    send_line(
        writer,
        &Control::TcpBaseline {
            port: dst.port(),
            region,
            chunk,
        },
    )?;
    reader.get_mut().set_nonblocking(false)?;
    match read_line::<Control>(reader)? {
        Control::TcpReady => {}
        other => {
            return Err(PerfError::Protocol(format!(
                "expected the TCP baseline's listener, got {other:?}"
            )))
        }
    }
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(dst),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    sock.bind(&SocketAddr::new(common.bind.ip(), 0).into())?;
    sock.connect_timeout(&dst.into(), std::time::Duration::from_secs(10))?;
    let mut stream: TcpStream = sock.into();
    let chunk = chunk.max(1);
    let data: Vec<u8> = (0..region.max(chunk)).map(pattern).collect();
    let t0 = StdInstant::now();
    let cpu0 = thread_cpu_seconds();
    let blast = std::time::Duration::from_secs_f64(BASELINE_SECS);
    let (mut at, mut sent) = (0usize, 0u64);
    while t0.elapsed() < blast {
        if at + chunk > data.len() {
            at = 0;
        }
        std::io::Write::write_all(&mut stream, &data[at..at + chunk])?;
        at += chunk;
        sent += chunk as u64;
    }
    stream.shutdown(std::net::Shutdown::Write)?;
    let sender_cpu = thread_cpu_seconds() - cpu0;
    match read_line::<Control>(reader)? {
        Control::BaselineResult {
            bytes, cpu_seconds, ..
        } => {
            let secs = t0.elapsed().as_secs_f64();
            Ok(UdpPhase {
                gbit_per_s: bytes as f64 * 8.0 / secs / 1e9,
                pkt_per_s: (bytes / chunk as u64) as f64 / secs,
                client_cpu_ns_per_byte: per_byte_ns(sender_cpu, sent),
                server_cpu_ns_per_byte: cpu_seconds.map(|c| per_byte_ns(c, bytes)),
            })
        }
        other => Err(PerfError::Protocol(format!(
            "expected baseline result, got {other:?}"
        ))),
    }
}

/// The server's end of [`tcp_phase`]: listens at `addr`, says so, takes
/// one connection and reads it to its end (bounded: 10 s for the
/// connection, 10 s per read, a minute in all).
pub(super) fn tcp_sink(
    addr: SocketAddr,
    region: usize,
    chunk: usize,
    writer: &mut TcpStream,
) -> Result<Control, PerfError> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    send_line(writer, &Control::TcpReady)?;
    let start = StdInstant::now();
    let mut stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if start.elapsed() > std::time::Duration::from_secs(10) {
                    return Err(PerfError::Protocol(
                        "the TCP baseline's client never connected".into(),
                    ));
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err(e) => return Err(e.into()),
        }
    };
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    let chunk = chunk.clamp(1, 1 << 24);
    let mut buf = vec![0u8; region.clamp(chunk, 1 << 30)];
    let (mut at, mut bytes) = (0usize, 0u64);
    let cpu0 = thread_cpu_seconds();
    loop {
        if at + chunk > buf.len() {
            at = 0;
        }
        let n = std::io::Read::read(&mut stream, &mut buf[at..at + chunk])?;
        if n == 0 {
            break;
        }
        at += n;
        bytes += n as u64;
        if start.elapsed() > std::time::Duration::from_secs(60) {
            return Err(PerfError::Protocol("TCP baseline never ended".into()));
        }
    }
    Ok(Control::BaselineResult {
        datagrams: 0,
        bytes,
        cpu_seconds: Some(thread_cpu_seconds() - cpu0),
    })
}

#[cfg(test)]
mod floor_tests {
    use super::Sink;

    fn with_crc(payload: &[u8]) -> Vec<u8> {
        let mut d = payload.to_vec();
        d.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        d
    }

    #[test]
    fn the_floor_sink_places_payloads_whose_crc_holds_and_drops_the_rest() {
        let mut sink = Sink::new(true, 1 << 16);
        let a: Vec<u8> = (0..100u8).collect();
        assert_eq!(sink.take(&with_crc(&a)), 100);
        let mut bad = with_crc(&[7u8; 50]);
        bad[3] ^= 1;
        assert_eq!(sink.take(&bad), 0);
        assert_eq!(sink.take(&[1, 2, 3]), 0, "shorter than a CRC");
        let b = [9u8; 30];
        assert_eq!(sink.take(&with_crc(&b)), 30);
        assert_eq!(sink.bad_crcs, 2);
        let region = sink.region.as_ref().unwrap();
        // In order, one after the other; nothing of the bad datagram.
        assert_eq!(&region[..100], &a[..]);
        assert_eq!(&region[100..130], &b[..]);
        assert!(region[130..].iter().all(|&x| x == 0));
    }

    #[test]
    fn a_shaped_floor_sizes_each_message_as_a_write_and_keeps_its_bytes() {
        use super::datagram_lens;
        // 64 KiB messages of 4 KiB datagrams, two and a half of them.
        let lens = datagram_lens(160 << 10, 4096, Some(64 << 10));
        assert_eq!(lens.iter().sum::<usize>(), 160 << 10);
        assert_eq!(lens.len(), 40);
        for m in 0..2 {
            let one = &lens[m * 16..(m + 1) * 16];
            assert_eq!(one[0], 4096 + 16, "the first carries the RETH's room");
            assert!(one[1..15].iter().all(|&l| l == 4096));
            assert_eq!(one[15], 4096 - 16);
        }
        assert!(lens[32..].iter().all(|&l| l == 4096), "the rest as without");
        // Unshaped, a message of one datagram, or a last one of 16 bytes.
        assert_eq!(datagram_lens(10_000, 4096, None), [4096, 4096, 1808]);
        assert_eq!(datagram_lens(8192, 4096, Some(4096)), [4096, 4096]);
        assert_eq!(datagram_lens(8208, 4096, Some(4112)), [4096, 4096, 16]);
    }

    #[test]
    fn the_floor_sink_wraps_at_the_end_of_its_region() {
        let mut sink = Sink::new(true, 0);
        let len = sink.region.as_ref().unwrap().len();
        assert_eq!(len, 1 << 16, "the region has a floor of 64 KiB");
        let d = vec![5u8; 40_000];
        assert_eq!(sink.take(&with_crc(&d)), 40_000);
        let e = vec![6u8; 40_000];
        assert_eq!(sink.take(&with_crc(&e)), 40_000);
        // The second did not fit after the first: it starts again at 0.
        assert_eq!(sink.region.as_ref().unwrap()[0], 6);
        assert_eq!(sink.at, 40_000);
    }

    #[test]
    fn the_plain_sink_counts_whole_datagrams() {
        let mut sink = Sink::new(false, 1 << 20);
        assert!(sink.region.is_none());
        assert_eq!(sink.take(&[0u8; 17]), 17);
    }
}
