//! Bodies of the fuzz targets in `fuzz/`, shared with the deterministic
//! tests in `tests/fuzz_bodies.rs`. Each must not panic on any input.

use crate::handshake::{ExportInfo, Handshake, Step};
use crate::transmission::{Outcome, Transmission};
use crate::volume::Volume;
use crate::wire::{
    BlockSizes, GoRepr, InfoRepr, OptionReply, OptionReplyRepr, Request, RequestRepr, SimpleReply,
    SimpleReplyRepr,
};
use blockload::RamDevice;
use std::sync::Arc;

/// Parses `data` as a stream of requests with payloads and executes them
/// against a small RAM device; checks every reply is well formed.
pub fn requests(data: &[u8]) {
    let volume = Arc::new(Volume::new(Arc::new(RamDevice::new(512, 16))).expect("valid geometry"));
    let tx = Transmission::new(volume, data.first().is_some_and(|b| b & 1 == 1));
    let mut rest = data;
    let mut out = Vec::new();
    // Each round consumes at least a 28-byte header.
    while let Ok(view) = Request::new_checked(rest) {
        let Ok(req) = RequestRepr::parse(&view) else {
            return;
        };
        let mut emitted = [0u8; 28];
        req.emit(&mut Request::new_unchecked(&mut emitted[..]));
        assert_eq!(&emitted[..], &rest[..28], "request re-emits identically");
        rest = &rest[28..];
        let Ok(n) = tx.payload_len(&req) else { return };
        // A short payload is still passed through: execute must cope.
        let n = n.min(rest.len());
        let (payload, tail) = rest.split_at(n);
        rest = tail;
        out.clear();
        if tx.execute(&req, payload, &mut out) == Outcome::Disconnect {
            assert!(out.is_empty());
            return;
        }
        let reply =
            SimpleReplyRepr::parse(&SimpleReply::new_checked(&out[..]).expect("reply header"))
                .expect("reply magic");
        assert_eq!(reply.cookie, req.cookie);
        let data_len = out.len() - 16;
        if reply.error.is_some() || req.command != crate::wire::Command::Read {
            assert_eq!(data_len, 0);
        } else {
            assert_eq!(data_len, req.length as usize);
        }
    }
}

/// Feeds `data` to a handshake in the pieces it asks for; checks the
/// server's output is a greeting followed by well-formed replies.
pub fn handshake(data: &[u8]) {
    let info = ExportInfo {
        name: "lun".into(),
        size: 1 << 20,
        flags: 0x016d,
        block_sizes: BlockSizes {
            minimum: 1,
            preferred: 512,
            maximum: 32 << 20,
        },
    };
    let mut out = Vec::new();
    let mut hs = Handshake::new(info, &mut out);
    let mut rest = data;
    let mut last = Step::Continue;
    // Each round consumes want() bytes; zero-length data is consumed with
    // its header, so rounds are bounded by the input length.
    while let Some(n) = hs.want() {
        if n > rest.len() {
            break;
        }
        let (piece, tail) = rest.split_at(n);
        rest = tail;
        last = hs.handle(piece, &mut out);
        if last != Step::Continue {
            break;
        }
    }
    let mut replies = &out[18..];
    while !replies.is_empty() {
        let parsed = OptionReply::new_checked(replies)
            .ok()
            .and_then(|v| OptionReplyRepr::parse(&v).ok());
        let Some(reply) = parsed else {
            // Only the NBD_OPT_EXPORT_NAME reply (10 bytes, or 134 with
            // zeroes) is not an option reply, and it comes last.
            assert_eq!(last, Step::Transmission);
            assert!(replies.len() == 10 || replies.len() == 134);
            return;
        };
        let end = 20 + reply.length as usize;
        assert!(end <= replies.len(), "reply length inside output");
        if reply.reply_type == crate::wire::ReplyType::Info {
            InfoRepr::parse(&replies[20..end]).expect("our info items parse");
        }
        replies = &replies[end..];
    }
}

/// Parses `data` as `NBD_OPT_GO` data and round-trips what parses.
pub fn go_data(data: &[u8]) {
    if let Ok(go) = GoRepr::parse(data) {
        let mut out = Vec::new();
        go.emit(&mut out);
        assert_eq!(out, data);
    }
    let _ = InfoRepr::parse(data);
}
