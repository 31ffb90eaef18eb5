//! Byte streams of real clients and a real server, from
//! `testdata/nbd/qemu-clients-to-qemu-nbd.pcapng` (qemu-img 7.2, qemu-io
//! 7.2 and nbdinfo 1.14 talking to qemu-nbd 7.2; see `capture.sh` and
//! `extract.py` there).
//!
//! Client bytes are replayed into our handshake and transmission; server
//! bytes are decoded with our wire types.

use blockload::RamDevice;
use nbd::handshake::{ExportInfo, Handshake, Step};
use nbd::transmission::{Outcome, Transmission};
use nbd::volume::Volume;
use nbd::wire::{
    Command, Greeting, GreetingRepr, InfoRepr, OptionCode, OptionReply, OptionReplyRepr, ReplyType,
    Request, RequestRepr, SimpleReply, SimpleReplyRepr, OPTION_REPLY_MAGIC,
};
use std::sync::Arc;

/// (client-to-server, server-to-client) streams of one connection.
fn streams(name: &str) -> (Vec<u8>, Vec<u8>) {
    let path = format!(
        "{}/../../testdata/nbd/{name}.hex",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let (mut c, mut s) = (Vec::new(), Vec::new());
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (side, hex) = line.split_once(' ').unwrap();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        match side {
            "C" => c.extend(bytes),
            "S" => s.extend(bytes),
            _ => panic!("bad line {line}"),
        }
    }
    (c, s)
}

/// Decodes qemu-nbd's greeting and option replies.
fn server_handshake(s: &[u8]) -> Vec<(OptionCode, ReplyType, Vec<u8>)> {
    let g = GreetingRepr::parse(&Greeting::new_checked(s).unwrap()).unwrap();
    assert_eq!(g.flags, 3, "qemu-nbd: FIXED_NEWSTYLE | NO_ZEROES");
    let mut rest = &s[18..];
    let mut replies = Vec::new();
    while rest.len() >= 20 && rest[..8] == OPTION_REPLY_MAGIC.to_be_bytes() {
        let r = OptionReplyRepr::parse(&OptionReply::new_checked(rest).unwrap()).unwrap();
        let end = 20 + r.length as usize;
        replies.push((r.option, r.reply_type, rest[20..end].to_vec()));
        rest = &rest[end..];
    }
    replies
}

#[test]
fn qemu_nbd_replies_decode() {
    for name in ["qemu-img-info", "qemu-io-write-read-flush", "nbdinfo"] {
        let (_, s) = streams(name);
        let replies = server_handshake(&s);
        let (last_option, last_type, _) = replies.last().unwrap();
        assert_eq!(
            (*last_option, *last_type),
            (OptionCode::Go, ReplyType::Ack),
            "{name}"
        );
        let export = replies
            .iter()
            .filter(|(_, t, _)| *t == ReplyType::Info)
            .map(|(_, _, d)| InfoRepr::parse(d).unwrap())
            .find(|i| matches!(i, InfoRepr::Export { .. }))
            .unwrap();
        let InfoRepr::Export { size, flags } = export else {
            unreachable!()
        };
        assert_eq!(size, 1 << 20, "{name}");
        assert_ne!(flags & nbd::wire::transmission_flags::HAS_FLAGS, 0);
        // qemu-nbd 7.2 accepts structured replies, which we refuse.
        assert!(replies
            .iter()
            .any(|(o, t, _)| *o == OptionCode::StructuredReply && *t == ReplyType::Ack));
    }
}

/// Replays one client's bytes into our server core; returns the options
/// it sent with our answers, and the commands with our reply errors.
struct Replay {
    options: Vec<(OptionCode, ReplyType)>,
    commands: Vec<(Command, Option<nbd::wire::Errno>, Vec<u8>)>,
}

fn replay(name: &str) -> Replay {
    let (c, _) = streams(name);
    let volume = Arc::new(Volume::new(Arc::new(RamDevice::new(512, 2048))).unwrap());
    let tx = Transmission::new(volume.clone(), false);
    let info = ExportInfo {
        name: "lun".into(),
        size: volume.size(),
        flags: tx.flags(),
        block_sizes: tx.block_sizes(),
    };
    let mut out = Vec::new();
    let mut hs = Handshake::new(info, &mut out);
    let mut rest = &c[..];
    let mut step = Step::Continue;
    while let Some(n) = hs.want() {
        let (piece, tail) = rest.split_at(n);
        rest = tail;
        step = hs.handle(piece, &mut out);
        if step != Step::Continue {
            break;
        }
    }
    assert_eq!(step, Step::Transmission, "{name}");
    let mut options = Vec::new();
    let mut ours = &out[18..];
    while !ours.is_empty() {
        let r = OptionReplyRepr::parse(&OptionReply::new_checked(ours).unwrap()).unwrap();
        options.push((r.option, r.reply_type));
        ours = &ours[20 + r.length as usize..];
    }
    let mut commands = Vec::new();
    while !rest.is_empty() {
        let req = RequestRepr::parse(&Request::new_checked(rest).unwrap()).unwrap();
        let n = tx.payload_len(&req).unwrap();
        let payload = &rest[28..28 + n];
        rest = &rest[28 + n..];
        out.clear();
        if tx.execute(&req, payload, &mut out) == Outcome::Disconnect {
            commands.push((req.command, None, vec![]));
            assert!(rest.is_empty(), "{name}: bytes after NBD_CMD_DISC");
            break;
        }
        let reply = SimpleReplyRepr::parse(&SimpleReply::new_checked(&out[..]).unwrap()).unwrap();
        assert_eq!(reply.cookie, req.cookie);
        commands.push((req.command, reply.error, out[16..].to_vec()));
    }
    Replay { options, commands }
}

#[test]
fn qemu_img_info_against_our_core() {
    let r = replay("qemu-img-info");
    // Every option qemu-img sent gets an answer; ours ends with GO's ACK.
    assert_eq!(r.options.last(), Some(&(OptionCode::Go, ReplyType::Ack)));
    assert!(r
        .options
        .contains(&(OptionCode::StructuredReply, ReplyType::ErrUnsup)));
    let cmds: Vec<_> = r
        .commands
        .iter()
        .map(|(c, e, d)| (*c, *e, d.len()))
        .collect();
    assert_eq!(cmds, [(Command::Read, None, 512), (Command::Disc, None, 0)]);
}

#[test]
fn qemu_io_write_read_flush_against_our_core() {
    let r = replay("qemu-io-write-read-flush");
    assert_eq!(r.options.last(), Some(&(OptionCode::Go, ReplyType::Ack)));
    let (writes, reads): (Vec<_>, Vec<_>) = r
        .commands
        .iter()
        .filter(|(c, _, _)| matches!(c, Command::Write | Command::Read))
        .partition(|(c, _, _)| *c == Command::Write);
    assert_eq!(writes.len(), 1);
    assert!(
        r.commands.iter().all(|(_, e, _)| e.is_none()),
        "{:?}",
        r.commands.iter().map(|c| (c.0, c.1)).collect::<Vec<_>>()
    );
    assert!(r.commands.iter().any(|(c, _, _)| *c == Command::Flush));
    // The read after `write -P 0xab 512 4096` returns the pattern.
    let last_read = &reads.last().unwrap().2;
    assert_eq!(last_read, &vec![0xab; 4096]);
}

#[test]
fn nbdinfo_against_our_core() {
    let r = replay("nbdinfo");
    assert_eq!(r.options.last(), Some(&(OptionCode::Go, ReplyType::Ack)));
    assert!(
        r.options.contains(&(OptionCode::Info, ReplyType::Ack)),
        "{:?}",
        r.options
    );
    assert_eq!(r.commands.last().map(|c| c.0), Some(Command::Disc));
}
