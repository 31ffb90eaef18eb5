//! Hostile and broken clients: the server hangs up or answers with an
//! error, stays alive, and serves the next good client.

mod common;

use blockload::RamDevice;
use common::{pattern, run, tcp, Client, Rng};
use nbd::wire::{Command, Errno, OptionCode};
use nbd::{Export, Server, ServerHandle};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

fn serve() -> ServerHandle {
    let dev = Arc::new(RamDevice::new(512, 2048));
    Server::bind_tcp("127.0.0.1:0", Export::new("lun", dev))
        .unwrap()
        .spawn()
        .unwrap()
}

/// Sends `bytes` after the greeting, then expects the server to close
/// the connection (possibly after some replies).
fn expect_hangup(h: &ServerHandle, bytes: &[u8]) {
    let mut s = tcp(h.local_addr());
    common::greeting(&mut s);
    // The server may close while we are still writing.
    let _ = s.write_all(bytes);
    let mut rest = Vec::new();
    match s.read_to_end(&mut rest) {
        Ok(_) => {}
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
}

/// Completes a handshake and returns the stream in transmission phase.
fn session(h: &ServerHandle) -> Client<TcpStream> {
    Client::go(tcp(h.local_addr()), "lun")
}

fn header(magic: u32, command: u16, offset: u64, length: u32) -> Vec<u8> {
    let mut v = magic.to_be_bytes().to_vec();
    v.extend_from_slice(&0u16.to_be_bytes());
    v.extend_from_slice(&command.to_be_bytes());
    v.extend_from_slice(&1u64.to_be_bytes());
    v.extend_from_slice(&offset.to_be_bytes());
    v.extend_from_slice(&length.to_be_bytes());
    v
}

fn good_client_works(h: &ServerHandle, seed: u64) {
    let mut c = session(h);
    let data = pattern(seed, 777, 5000);
    c.write(777, &data).unwrap();
    assert_eq!(c.read(777, 5000).unwrap(), data);
    c.disconnect();
}

#[test]
fn server_survives_malformed_clients() {
    let h = serve();
    // Handshake phase.
    expect_hangup(&h, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"); // "GET " as client flags
    expect_hangup(&h, b"\0\0\0\x01IHAVEOPX\0\0\0\x07\0\0\0\0"); // wrong option magic
    expect_hangup(&h, b"\0\0\0\x01IHAVEOPT\0\0\0\x07\xff\xff\xff\xff"); // 4 GiB option
    expect_hangup(&h, b"\0\0\0\x01IHAVEOPT\0\0\0\x01\0\0\0\x04nope"); // EXPORT_NAME unknown
    good_client_works(&h, 1);
    let hangups = 4;
    assert_eq!(h.stats().protocol_errors, hangups);

    // Truncated handshakes: the client goes away mid-message.
    for cut in [0usize, 2, 4, 10, 20] {
        let msg = b"\0\0\0\x03IHAVEOPT\0\0\0\x07\0\0\0\x0a\0\0\0\0\0\0";
        expect_hangup_after_close(&h, &msg[..cut]);
    }
    good_client_works(&h, 2);

    // Transmission phase.
    let mut c = session(&h);
    c.s.write_all(&header(0x1234_5678, 0, 0, 512)).unwrap(); // wrong magic
    assert_eof(&mut c.s);
    let mut c = session(&h);
    c.s.write_all(&header(0x2560_9513, 1, 0, u32::MAX)).unwrap(); // 4 GiB WRITE
    assert_eof(&mut c.s);
    let hangups = hangups + 2;
    // A huge READ is an error reply; the session goes on.
    let mut c = session(&h);
    assert_eq!(
        c.call(Command::Read, 0, 0, u32::MAX, &[]),
        Err(Errno::Inval)
    );
    assert_eq!(
        c.call(Command::Read, 0, u64::MAX, 1, &[]),
        Err(Errno::Inval)
    );
    assert_eq!(c.read(0, 4).unwrap(), [0, 0, 0, 0]);
    // Truncated request header and truncated write payload.
    let mut c = session(&h);
    c.s.write_all(&header(0x2560_9513, 0, 0, 512)[..10])
        .unwrap();
    drop(c);
    let mut c = session(&h);
    c.s.write_all(&header(0x2560_9513, 1, 0, 4096)).unwrap();
    c.s.write_all(&[9u8; 100]).unwrap();
    drop(c);
    // Random garbage after a good handshake.
    let mut rng = Rng(0xbad);
    for _ in 0..4 {
        let mut c = session(&h);
        let junk: Vec<u8> = (0..4096).map(|_| rng.next() as u8).collect();
        let _ = c.s.write_all(&junk);
        assert_eof(&mut c.s);
    }
    let hangups = hangups + 4;
    good_client_works(&h, 3);
    assert_eq!(h.stats().protocol_errors, hangups);
    // The truncated write never reached the device.
    let mut c = session(&h);
    assert_eq!(c.read(0, 4).unwrap(), [0, 0, 0, 0]);

    if rdma_testkit::need::part("the qemu-img check").tool("qemu-img") {
        assert!(run("qemu-img", &["info", &h.uri()]).contains("1 MiB"));
    }
    h.shutdown();
}

/// Sends a prefix of a handshake and closes the socket.
fn expect_hangup_after_close(h: &ServerHandle, bytes: &[u8]) {
    let mut s = tcp(h.local_addr());
    common::greeting(&mut s);
    s.write_all(bytes).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "no reply to a partial option");
}

/// Reads until the server closes; replies sent before are skipped.
fn assert_eof(s: &mut TcpStream) {
    let mut rest = Vec::new();
    if let Err(e) = s.read_to_end(&mut rest) {
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    }
}

/// Options the server does not know or refuses keep the session usable.
#[test]
fn refused_options_then_go() {
    let h = serve();
    let mut s = tcp(h.local_addr());
    common::greeting(&mut s);
    s.write_all(&1u32.to_be_bytes()).unwrap();
    for (code, data) in [
        (8u32, &[][..]),
        (11, &[]),
        (5, &[]),
        (10, &[0u8; 12][..]),
        (0xdead, &[1, 2, 3][..]),
    ] {
        common::send_option(&mut s, OptionCode::from(code), data);
        let (r, msg) = common::read_option_reply(&mut s);
        assert_eq!(
            r.reply_type,
            nbd::wire::ReplyType::ErrUnsup,
            "option {code}"
        );
        assert!(String::from_utf8(msg).unwrap().contains("not supported"));
    }
    let mut c = Client::resume_go(s, "lun");
    c.write(0, b"ok").unwrap();
    assert_eq!(c.read(0, 2).unwrap(), b"ok");
}
