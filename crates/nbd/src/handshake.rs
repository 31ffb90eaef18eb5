//! Fixed newstyle handshake and option haggling as a sans-IO state machine
//! (proto.md "Fixed newstyle negotiation", "Option types").
//!
//! Call order: [`Handshake::new`] appends the greeting to `out`; then, as
//! long as [`Handshake::want`] returns `Some(n)`, read exactly `n` bytes
//! from the client, pass them to [`Handshake::handle`], and send what it
//! appended to `out`. Each call does work bounded by its input. The
//! [`Step`] says whether to continue, enter transmission, or hang up.

use crate::wire::{
    client_flags, handshake_flags, BlockSizes, ExportNameReplyRepr, GoRepr, InfoRepr, InfoType,
    OptionCode, OptionHeader, OptionHeaderRepr, OptionReplyRepr, ReplyType, MAX_STRING,
};
use crate::Hangup;

/// Longest option data read; longer options end the session (proto.md
/// allows a hard disconnect for denial of service).
pub const MAX_OPTION_DATA: u32 = 64 * 1024;
/// Most options one client may send before transmission.
pub const MAX_OPTIONS: u32 = 64;

/// What the server exports, as the handshake announces it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    /// The export's name; `""` (the default export) also reaches it.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Transmission flags.
    pub flags: u16,
    /// Size constraints sent as `NBD_INFO_BLOCK_SIZE`.
    pub block_sizes: BlockSizes,
}

impl ExportInfo {
    /// True if `name` selects this export.
    pub fn answers_to(&self, name: &str) -> bool {
        name.is_empty() || name == self.name
    }
}

/// What to do after [`Handshake::handle`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send `out` and read [`Handshake::want`] more bytes.
    Continue,
    /// Send `out`; the transmission phase starts with the next byte.
    Transmission,
    /// Send `out`, then close the connection.
    Close(Hangup),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    ClientFlags,
    OptionHeader,
    OptionData(OptionHeaderRepr),
    Done,
}

/// One connection's handshake.
#[derive(Debug)]
pub struct Handshake {
    export: ExportInfo,
    state: State,
    no_zeroes: bool,
    options: u32,
}

impl Handshake {
    /// Starts a handshake; appends the greeting to `out`.
    pub fn new(export: ExportInfo, out: &mut Vec<u8>) -> Handshake {
        let flags = handshake_flags::FIXED_NEWSTYLE | handshake_flags::NO_ZEROES;
        out.extend_from_slice(&crate::wire::NBDMAGIC.to_be_bytes());
        out.extend_from_slice(&crate::wire::IHAVEOPT.to_be_bytes());
        out.extend_from_slice(&flags.to_be_bytes());
        Handshake {
            export,
            state: State::ClientFlags,
            no_zeroes: false,
            options: 0,
        }
    }

    /// Bytes [`Handshake::handle`] needs next; `None` once finished.
    pub fn want(&self) -> Option<usize> {
        match self.state {
            State::ClientFlags => Some(4),
            State::OptionHeader => Some(OptionHeader::<&[u8]>::LEN),
            State::OptionData(h) => Some(h.length as usize),
            State::Done => None,
        }
    }

    /// Consumes exactly `want()` bytes; appends the replies to `out`.
    pub fn handle(&mut self, input: &[u8], out: &mut Vec<u8>) -> Step {
        let step = self.step(input, out);
        if step != Step::Continue {
            self.state = State::Done;
        }
        step
    }

    fn step(&mut self, input: &[u8], out: &mut Vec<u8>) -> Step {
        if Some(input.len()) != self.want() {
            return Step::Close(Hangup::Truncated);
        }
        match self.state {
            State::ClientFlags => {
                let mut b = [0u8; 4];
                b.copy_from_slice(input);
                let flags = u32::from_be_bytes(b);
                let known = client_flags::FIXED_NEWSTYLE | client_flags::NO_ZEROES;
                if flags & !known != 0 {
                    // proto.md "Client flags": MUST drop the connection.
                    return Step::Close(Hangup::ClientFlags(flags));
                }
                self.no_zeroes = flags & client_flags::NO_ZEROES != 0;
                self.state = State::OptionHeader;
                Step::Continue
            }
            State::OptionHeader => {
                let header = match OptionHeaderRepr::parse(&OptionHeader::new_unchecked(input)) {
                    Ok(h) => h,
                    Err(_) => return Step::Close(Hangup::BadMagic),
                };
                self.options += 1;
                if self.options > MAX_OPTIONS {
                    return Step::Close(Hangup::TooManyOptions);
                }
                if header.length > MAX_OPTION_DATA {
                    return Step::Close(Hangup::OptionTooLong(header.length));
                }
                if header.length == 0 {
                    return self.option(header.option, &[], out);
                }
                self.state = State::OptionData(header);
                Step::Continue
            }
            State::OptionData(header) => self.option(header.option, input, out),
            State::Done => Step::Close(Hangup::Truncated),
        }
    }

    fn option(&mut self, option: OptionCode, data: &[u8], out: &mut Vec<u8>) -> Step {
        self.state = State::OptionHeader;
        match option {
            OptionCode::ExportName => {
                let ok = data.len() <= MAX_STRING
                    && std::str::from_utf8(data).is_ok_and(|n| self.export.answers_to(n));
                if !ok {
                    // No error path exists for this option: hang up (proto.md).
                    return Step::Close(Hangup::UnknownExport(
                        String::from_utf8_lossy(data).into_owned(),
                    ));
                }
                let reply = ExportNameReplyRepr {
                    size: self.export.size,
                    flags: self.export.flags,
                };
                reply.emit(self.no_zeroes, out);
                Step::Transmission
            }
            OptionCode::Abort => {
                reply(option, ReplyType::Ack, &[], out);
                Step::Close(Hangup::Aborted)
            }
            OptionCode::List => {
                if !data.is_empty() {
                    reply(
                        option,
                        ReplyType::ErrInvalid,
                        b"NBD_OPT_LIST takes no data",
                        out,
                    );
                    return Step::Continue;
                }
                let mut entry = Vec::with_capacity(4 + self.export.name.len());
                entry.extend_from_slice(&(self.export.name.len() as u32).to_be_bytes());
                entry.extend_from_slice(self.export.name.as_bytes());
                reply(option, ReplyType::Server, &entry, out);
                reply(option, ReplyType::Ack, &[], out);
                Step::Continue
            }
            OptionCode::Info | OptionCode::Go => self.info_or_go(option, data, out),
            _ => {
                let msg = format!("{option} is not supported by this server");
                reply(option, ReplyType::ErrUnsup, msg.as_bytes(), out);
                Step::Continue
            }
        }
    }

    fn info_or_go(&mut self, option: OptionCode, data: &[u8], out: &mut Vec<u8>) -> Step {
        let go = match GoRepr::parse(data) {
            Ok(go) => go,
            Err(e) => {
                reply(option, ReplyType::ErrInvalid, e.to_string().as_bytes(), out);
                return Step::Continue;
            }
        };
        if !self.export.answers_to(&go.name) {
            let msg = format!("no export named `{}`", go.name);
            reply(option, ReplyType::ErrUnknown, msg.as_bytes(), out);
            return Step::Continue;
        }
        let mut items = vec![
            InfoRepr::Export {
                size: self.export.size,
                flags: self.export.flags,
            },
            InfoRepr::BlockSize(self.export.block_sizes),
        ];
        if go.requests.contains(&InfoType::Name) {
            items.push(InfoRepr::Name(self.export.name.clone()));
        }
        let mut data = Vec::new();
        for item in items {
            data.clear();
            item.emit(&mut data);
            reply(option, ReplyType::Info, &data, out);
        }
        reply(option, ReplyType::Ack, &[], out);
        if option == OptionCode::Go {
            Step::Transmission
        } else {
            Step::Continue
        }
    }
}

fn reply(option: OptionCode, reply_type: ReplyType, data: &[u8], out: &mut Vec<u8>) {
    OptionReplyRepr {
        option,
        reply_type,
        length: data.len() as u32,
    }
    .push(data, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{OptionReply, NBDMAGIC};

    fn export() -> ExportInfo {
        ExportInfo {
            name: "lun0".into(),
            size: 1 << 20,
            flags: 0x016d,
            block_sizes: BlockSizes {
                minimum: 1,
                preferred: 4096,
                maximum: 32 << 20,
            },
        }
    }

    /// Feeds `input` in `want()`-sized pieces; returns the last step and
    /// everything the server sent.
    fn run(input: &[u8]) -> (Step, Vec<u8>) {
        let mut out = Vec::new();
        let mut hs = Handshake::new(export(), &mut out);
        let mut at = 0;
        while let Some(n) = hs.want() {
            if at + n > input.len() {
                return (Step::Continue, out);
            }
            let step = hs.handle(&input[at..at + n], &mut out);
            at += n;
            if step != Step::Continue {
                assert_eq!(at, input.len(), "bytes left after {step:?}");
                return (step, out);
            }
        }
        unreachable!("handshake finished without a final step")
    }

    fn option(code: u32, data: &[u8]) -> Vec<u8> {
        let mut v = b"IHAVEOPT".to_vec();
        v.extend_from_slice(&code.to_be_bytes());
        v.extend_from_slice(&(data.len() as u32).to_be_bytes());
        v.extend_from_slice(data);
        v
    }

    /// Splits server output after the greeting into option replies.
    fn replies(mut out: &[u8]) -> Vec<(OptionReplyRepr, Vec<u8>)> {
        let mut v = Vec::new();
        while !out.is_empty() {
            let r = OptionReplyRepr::parse(&OptionReply::new_checked(out).unwrap()).unwrap();
            let end = 20 + r.length as usize;
            v.push((r, out[20..end].to_vec()));
            out = &out[end..];
        }
        v
    }

    #[test]
    fn greeting_is_fixed_newstyle_with_no_zeroes() {
        let (_, out) = run(&[]);
        assert_eq!(
            out,
            [
                0x4e, 0x42, 0x44, 0x4d, 0x41, 0x47, 0x49, 0x43, // NBDMAGIC
                0x49, 0x48, 0x41, 0x56, 0x45, 0x4f, 0x50, 0x54, // IHAVEOPT
                0x00, 0x03, // FIXED_NEWSTYLE | NO_ZEROES
            ]
        );
        assert_eq!(u64::from_be_bytes(out[..8].try_into().unwrap()), NBDMAGIC);
    }

    #[test]
    fn go_with_block_size_request() {
        let mut input = vec![0, 0, 0, 3]; // C_FIXED_NEWSTYLE | C_NO_ZEROES
        input.extend(option(
            7,
            &[0, 0, 0, 4, b'l', b'u', b'n', b'0', 0, 2, 0, 3, 0, 1],
        ));
        let (step, out) = run(&input);
        assert_eq!(step, Step::Transmission);
        let r = replies(&out[18..]);
        assert_eq!(r.len(), 4);
        assert!(r.iter().all(|(h, _)| h.option == OptionCode::Go));
        assert_eq!(r[0].0.reply_type, ReplyType::Info);
        assert_eq!(
            InfoRepr::parse(&r[0].1).unwrap(),
            InfoRepr::Export {
                size: 1 << 20,
                flags: 0x016d
            }
        );
        assert_eq!(
            InfoRepr::parse(&r[1].1).unwrap(),
            InfoRepr::BlockSize(export().block_sizes)
        );
        assert_eq!(
            InfoRepr::parse(&r[2].1).unwrap(),
            InfoRepr::Name("lun0".into())
        );
        assert_eq!((r[3].0.reply_type, r[3].1.len()), (ReplyType::Ack, 0));
    }

    #[test]
    fn unsupported_options_then_info_then_export_name() {
        let mut input = vec![0, 0, 0, 1]; // C_FIXED_NEWSTYLE only: zeroes follow EXPORT_NAME
        input.extend(option(8, &[])); // STRUCTURED_REPLY
        input.extend(option(5, &[])); // STARTTLS
        input.extend(option(0x1234, &[1, 2, 3])); // unknown, data skipped
        input.extend(option(6, &[0, 0, 0, 0, 0, 0])); // INFO on the default export
        input.extend(option(3, &[])); // LIST
        input.extend(option(1, b"lun0")); // EXPORT_NAME
        let (step, out) = run(&input);
        assert_eq!(step, Step::Transmission);
        let tail = &out[out.len() - 134..];
        assert_eq!(
            ExportNameReplyRepr::parse(tail).unwrap(),
            ExportNameReplyRepr {
                size: 1 << 20,
                flags: 0x016d
            }
        );
        assert!(tail[10..].iter().all(|&b| b == 0));
        let r = replies(&out[18..out.len() - 134]);
        let types: Vec<_> = r.iter().map(|(h, _)| (h.option, h.reply_type)).collect();
        assert_eq!(
            types,
            [
                (OptionCode::StructuredReply, ReplyType::ErrUnsup),
                (OptionCode::StartTls, ReplyType::ErrUnsup),
                (OptionCode::Unknown(0x1234), ReplyType::ErrUnsup),
                (OptionCode::Info, ReplyType::Info),
                (OptionCode::Info, ReplyType::Info),
                (OptionCode::Info, ReplyType::Ack),
                (OptionCode::List, ReplyType::Server),
                (OptionCode::List, ReplyType::Ack),
            ]
        );
        assert_eq!(r[6].1, [0, 0, 0, 4, b'l', b'u', b'n', b'0']);
    }

    #[test]
    fn errors_keep_the_session_open() {
        let mut input = vec![0, 0, 0, 3];
        input.extend(option(7, &[0, 0, 0, 3, b'x', b'y', b'z', 0, 0])); // unknown export
        input.extend(option(7, &[0, 0, 0, 9, 0, 0])); // name longer than data
        input.extend(option(3, &[1])); // LIST with data
        input.extend(option(2, &[])); // ABORT
        let (step, out) = run(&input);
        assert_eq!(step, Step::Close(Hangup::Aborted));
        let types: Vec<_> = replies(&out[18..])
            .iter()
            .map(|(h, _)| h.reply_type)
            .collect();
        assert_eq!(
            types,
            [
                ReplyType::ErrUnknown,
                ReplyType::ErrInvalid,
                ReplyType::ErrInvalid,
                ReplyType::Ack
            ]
        );
    }

    #[test]
    fn hangups() {
        assert_eq!(run(&[0, 0, 0, 4]).0, Step::Close(Hangup::ClientFlags(4)));
        let mut bad_magic = vec![0, 0, 0, 1];
        bad_magic.extend(b"IHAVEOPX\0\0\0\x07\0\0\0\0");
        assert_eq!(run(&bad_magic).0, Step::Close(Hangup::BadMagic));
        let mut huge = vec![0, 0, 0, 1];
        huge.extend(b"IHAVEOPT\0\0\0\x07\xff\xff\xff\xff");
        assert_eq!(run(&huge).0, Step::Close(Hangup::OptionTooLong(u32::MAX)));
        let mut unknown = vec![0, 0, 0, 1];
        unknown.extend(option(1, b"nope"));
        assert_eq!(
            run(&unknown).0,
            Step::Close(Hangup::UnknownExport("nope".into()))
        );
        let mut many = vec![0, 0, 0, 1];
        for _ in 0..=MAX_OPTIONS {
            many.extend(option(8, &[]));
        }
        assert_eq!(run(&many).0, Step::Close(Hangup::TooManyOptions));
        let mut out = Vec::new();
        let mut hs = Handshake::new(export(), &mut out);
        assert_eq!(hs.handle(&[0, 0], &mut out), Step::Close(Hangup::Truncated));
        assert_eq!(hs.want(), None);
    }
}
