//! NBD wire formats (proto.md "Handshake", "Transmission", "Values").
//!
//! All integers are big-endian. Fixed layouts are views (`Greeting`,
//! `OptionHeader`, `OptionReply`, `Request`, `SimpleReply`) with a `Repr`
//! beside each; the variable `NBD_OPT_INFO`/`NBD_OPT_GO` data and the
//! `NBD_REP_INFO` items are plain reprs.

use core::ops::Range;

/// `NBDMAGIC`, first word of the server greeting (proto.md "Newstyle").
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`, second word of the greeting and first word of each option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply (proto.md "Fixed newstyle negotiation").
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// `NBD_REQUEST_MAGIC` (proto.md "Request message").
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// `NBD_SIMPLE_REPLY_MAGIC` (proto.md "Simple reply message").
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

/// Handshake flags, sent by the server after the magics (proto.md "Handshake flags").
pub mod handshake_flags {
    /// `NBD_FLAG_FIXED_NEWSTYLE`.
    pub const FIXED_NEWSTYLE: u16 = 1 << 0;
    /// `NBD_FLAG_NO_ZEROES`.
    pub const NO_ZEROES: u16 = 1 << 1;
}

/// Client flags, the client's 32-bit answer to the greeting (proto.md "Client flags").
pub mod client_flags {
    /// `NBD_FLAG_C_FIXED_NEWSTYLE`.
    pub const FIXED_NEWSTYLE: u32 = 1 << 0;
    /// `NBD_FLAG_C_NO_ZEROES`.
    pub const NO_ZEROES: u32 = 1 << 1;
}

/// Transmission flags of an export (proto.md "Transmission flags").
pub mod transmission_flags {
    /// `NBD_FLAG_HAS_FLAGS`, always set.
    pub const HAS_FLAGS: u16 = 1 << 0;
    /// `NBD_FLAG_READ_ONLY`.
    pub const READ_ONLY: u16 = 1 << 1;
    /// `NBD_FLAG_SEND_FLUSH`.
    pub const SEND_FLUSH: u16 = 1 << 2;
    /// `NBD_FLAG_SEND_FUA`.
    pub const SEND_FUA: u16 = 1 << 3;
    /// `NBD_FLAG_ROTATIONAL`.
    pub const ROTATIONAL: u16 = 1 << 4;
    /// `NBD_FLAG_SEND_TRIM`.
    pub const SEND_TRIM: u16 = 1 << 5;
    /// `NBD_FLAG_SEND_WRITE_ZEROES`.
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    /// `NBD_FLAG_SEND_DF`.
    pub const SEND_DF: u16 = 1 << 7;
    /// `NBD_FLAG_CAN_MULTI_CONN`.
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
}

/// Command flags of a request (proto.md "Command flags").
pub mod command_flags {
    /// `NBD_CMD_FLAG_FUA`: persist before replying.
    pub const FUA: u16 = 1 << 0;
    /// `NBD_CMD_FLAG_NO_HOLE`: write zeroes without deallocating.
    pub const NO_HOLE: u16 = 1 << 1;
    /// `NBD_CMD_FLAG_DF`.
    pub const DF: u16 = 1 << 2;
    /// `NBD_CMD_FLAG_REQ_ONE`.
    pub const REQ_ONE: u16 = 1 << 3;
    /// `NBD_CMD_FLAG_FAST_ZERO`.
    pub const FAST_ZERO: u16 = 1 << 4;
    /// `NBD_CMD_FLAG_PAYLOAD_LEN`.
    pub const PAYLOAD_LEN: u16 = 1 << 5;
}

open_enum! {
    /// Option codes (proto.md "Option types").
    pub enum OptionCode(u32) {
        /// Choose an export and enter transmission, no error path.
        ExportName = 1 => "NBD_OPT_EXPORT_NAME",
        /// Soft disconnect.
        Abort = 2 => "NBD_OPT_ABORT",
        /// List exports.
        List = 3 => "NBD_OPT_LIST",
        /// Withdrawn.
        PeekExport = 4 => "NBD_OPT_PEEK_EXPORT",
        /// Upgrade to TLS.
        StartTls = 5 => "NBD_OPT_STARTTLS",
        /// Describe an export.
        Info = 6 => "NBD_OPT_INFO",
        /// Describe an export and enter transmission.
        Go = 7 => "NBD_OPT_GO",
        /// Negotiate structured replies.
        StructuredReply = 8 => "NBD_OPT_STRUCTURED_REPLY",
        /// List metadata contexts.
        ListMetaContext = 9 => "NBD_OPT_LIST_META_CONTEXT",
        /// Select metadata contexts.
        SetMetaContext = 10 => "NBD_OPT_SET_META_CONTEXT",
        /// Negotiate 64-bit headers.
        ExtendedHeaders = 11 => "NBD_OPT_EXTENDED_HEADERS",
    }
}

open_enum! {
    /// Option reply types (proto.md "Option reply types"); bit 31 marks errors.
    pub enum ReplyType(u32) {
        /// Success, no data.
        Ack = 1 => "NBD_REP_ACK",
        /// One export of a list.
        Server = 2 => "NBD_REP_SERVER",
        /// One information item.
        Info = 3 => "NBD_REP_INFO",
        /// One metadata context.
        MetaContext = 4 => "NBD_REP_META_CONTEXT",
        /// Option not supported.
        ErrUnsup = 0x8000_0001 => "NBD_REP_ERR_UNSUP",
        /// Forbidden by policy.
        ErrPolicy = 0x8000_0002 => "NBD_REP_ERR_POLICY",
        /// Malformed option.
        ErrInvalid = 0x8000_0003 => "NBD_REP_ERR_INVALID",
        /// Not supported on this platform.
        ErrPlatform = 0x8000_0004 => "NBD_REP_ERR_PLATFORM",
        /// TLS required first.
        ErrTlsReqd = 0x8000_0005 => "NBD_REP_ERR_TLS_REQD",
        /// No such export.
        ErrUnknown = 0x8000_0006 => "NBD_REP_ERR_UNKNOWN",
        /// Server shutting down.
        ErrShutdown = 0x8000_0007 => "NBD_REP_ERR_SHUTDOWN",
        /// Client must request block sizes.
        ErrBlockSizeReqd = 0x8000_0008 => "NBD_REP_ERR_BLOCK_SIZE_REQD",
        /// Request or reply too large.
        ErrTooBig = 0x8000_0009 => "NBD_REP_ERR_TOO_BIG",
        /// Extended headers required.
        ErrExtHeaderReqd = 0x8000_000a => "NBD_REP_ERR_EXT_HEADER_REQD",
    }
}

impl ReplyType {
    /// True for the error replies (bit 31 set).
    pub fn is_error(self) -> bool {
        u32::from(self) & 0x8000_0000 != 0
    }
}

open_enum! {
    /// Information types of `NBD_REP_INFO` (proto.md "Option reply types").
    pub enum InfoType(u16) {
        /// Size and transmission flags.
        Export = 0 => "NBD_INFO_EXPORT",
        /// Canonical name.
        Name = 1 => "NBD_INFO_NAME",
        /// Human-readable description.
        Description = 2 => "NBD_INFO_DESCRIPTION",
        /// Minimum, preferred and maximum block sizes.
        BlockSize = 3 => "NBD_INFO_BLOCK_SIZE",
    }
}

open_enum! {
    /// Request types (proto.md "Request types").
    pub enum Command(u16) {
        /// Read `length` bytes.
        Read = 0 => "NBD_CMD_READ",
        /// Write the `length` bytes that follow.
        Write = 1 => "NBD_CMD_WRITE",
        /// Disconnect after outstanding requests; no reply.
        Disc = 2 => "NBD_CMD_DISC",
        /// Persist completed writes.
        Flush = 3 => "NBD_CMD_FLUSH",
        /// Discard a range (advisory).
        Trim = 4 => "NBD_CMD_TRIM",
        /// Prefetch.
        Cache = 5 => "NBD_CMD_CACHE",
        /// Zero a range.
        WriteZeroes = 6 => "NBD_CMD_WRITE_ZEROES",
        /// Query metadata contexts.
        BlockStatus = 7 => "NBD_CMD_BLOCK_STATUS",
        /// Experimental resize.
        Resize = 8 => "NBD_CMD_RESIZE",
    }
}

open_enum! {
    /// Error values of a reply (proto.md "Error values"); 0 means success
    /// and is not in this table.
    pub enum Errno(u32) {
        /// Operation not permitted (write to a read-only export).
        Perm = 1 => "NBD_EPERM",
        /// Input/output error.
        Io = 5 => "NBD_EIO",
        /// Cannot allocate memory.
        NoMem = 12 => "NBD_ENOMEM",
        /// Invalid argument.
        Inval = 22 => "NBD_EINVAL",
        /// No space left on device (write past the end).
        NoSpc = 28 => "NBD_ENOSPC",
        /// Value too large.
        Overflow = 75 => "NBD_EOVERFLOW",
        /// Operation not supported.
        NotSup = 95 => "NBD_ENOTSUP",
        /// Server shutting down.
        Shutdown = 108 => "NBD_ESHUTDOWN",
    }
}

/// Why bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The buffer is shorter than the layout needs.
    #[error("truncated: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes the layout needs.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// A magic number is wrong.
    #[error("bad {what} magic {value:#x}")]
    BadMagic {
        /// Which magic.
        what: &'static str,
        /// The value received.
        value: u64,
    },
    /// A field holds a value the layout forbids.
    #[error("malformed {what}: {detail}")]
    Malformed {
        /// The field.
        what: &'static str,
        /// What is wrong with it.
        detail: String,
    },
}

/// The length check of every layout (`what` names it for the reader;
/// the error itself says only how many bytes were missing).
fn truncated(_what: &'static str, need: usize, have: usize) -> Result<(), Error> {
    if have < need {
        Err(Error::Truncated { need, have })
    } else {
        Ok(())
    }
}

fn be16(b: &[u8], r: Range<usize>) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[r]);
    u16::from_be_bytes(a)
}

fn be32(b: &[u8], r: Range<usize>) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[r]);
    u32::from_be_bytes(a)
}

fn be64(b: &[u8], r: Range<usize>) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[r]);
    u64::from_be_bytes(a)
}

mod field {
    use core::ops::Range;
    // Greeting (proto.md "Newstyle negotiation").
    pub const G_NBDMAGIC: Range<usize> = 0..8;
    pub const G_IHAVEOPT: Range<usize> = 8..16;
    pub const G_FLAGS: Range<usize> = 16..18;
    // Option header, client to server.
    pub const O_MAGIC: Range<usize> = 0..8;
    pub const O_OPTION: Range<usize> = 8..12;
    pub const O_LENGTH: Range<usize> = 12..16;
    // Option reply header, server to client.
    pub const R_MAGIC: Range<usize> = 0..8;
    pub const R_OPTION: Range<usize> = 8..12;
    pub const R_TYPE: Range<usize> = 12..16;
    pub const R_LENGTH: Range<usize> = 16..20;
    // Request (proto.md "Request message").
    pub const Q_MAGIC: Range<usize> = 0..4;
    pub const Q_FLAGS: Range<usize> = 4..6;
    pub const Q_TYPE: Range<usize> = 6..8;
    pub const Q_COOKIE: Range<usize> = 8..16;
    pub const Q_OFFSET: Range<usize> = 16..24;
    pub const Q_LENGTH: Range<usize> = 24..28;
    // Simple reply (proto.md "Simple reply message").
    pub const S_MAGIC: Range<usize> = 0..4;
    pub const S_ERROR: Range<usize> = 4..8;
    pub const S_COOKIE: Range<usize> = 8..16;
}

rdma_types::view! {
    /// The server's first 18 bytes: `NBDMAGIC`, `IHAVEOPT`, handshake flags.
    pub struct Greeting; len 18; "Greeting", truncated => Error;
    nbdmagic / set_nbdmagic: u64 = field::G_NBDMAGIC;
    ihaveopt / set_ihaveopt: u64 = field::G_IHAVEOPT;
    flags / set_flags: u16 = field::G_FLAGS;
}

rdma_types::view! {
    /// An option header: `IHAVEOPT`, option code, data length.
    pub struct OptionHeader; len 16; "OptionHeader", truncated => Error;
    magic / set_magic: u64 = field::O_MAGIC;
    option / set_option: u32 = field::O_OPTION;
    length / set_length: u32 = field::O_LENGTH;
}

rdma_types::view! {
    /// An option reply header: magic, option, reply type, data length.
    pub struct OptionReply; len 20; "OptionReply", truncated => Error;
    magic / set_magic: u64 = field::R_MAGIC;
    option / set_option: u32 = field::R_OPTION;
    reply_type / set_reply_type: u32 = field::R_TYPE;
    length / set_length: u32 = field::R_LENGTH;
}

rdma_types::view! {
    /// A transmission request header (28 bytes; WRITE data follows).
    pub struct Request; len 28; "Request", truncated => Error;
    magic / set_magic: u32 = field::Q_MAGIC;
    flags / set_flags: u16 = field::Q_FLAGS;
    command / set_command: u16 = field::Q_TYPE;
    cookie / set_cookie: u64 = field::Q_COOKIE;
    offset / set_offset: u64 = field::Q_OFFSET;
    length / set_length: u32 = field::Q_LENGTH;
}

rdma_types::view! {
    /// A simple reply header (16 bytes; READ data follows on success).
    pub struct SimpleReply; len 16; "SimpleReply", truncated => Error;
    magic / set_magic: u32 = field::S_MAGIC;
    error / set_error: u32 = field::S_ERROR;
    cookie / set_cookie: u64 = field::S_COOKIE;
}

/// The greeting's content: only the handshake flags vary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GreetingRepr {
    /// Handshake flags ([`handshake_flags`]).
    pub flags: u16,
}

impl GreetingRepr {
    /// Parses a greeting.
    ///
    /// # Errors
    /// Truncation or either magic wrong.
    pub fn parse<T: AsRef<[u8]>>(p: &Greeting<T>) -> Result<GreetingRepr, Error> {
        if p.nbdmagic() != NBDMAGIC {
            return Err(Error::BadMagic {
                what: "NBDMAGIC",
                value: p.nbdmagic(),
            });
        }
        if p.ihaveopt() != IHAVEOPT {
            return Err(Error::BadMagic {
                what: "IHAVEOPT",
                value: p.ihaveopt(),
            });
        }
        Ok(GreetingRepr { flags: p.flags() })
    }

    /// Bytes emitted.
    pub fn buffer_len(&self) -> usize {
        Greeting::<&[u8]>::LEN
    }

    /// Writes the greeting.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Greeting<T>) {
        p.set_nbdmagic(NBDMAGIC);
        p.set_ihaveopt(IHAVEOPT);
        p.set_flags(self.flags);
    }
}

/// An option header's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeaderRepr {
    /// The option.
    pub option: OptionCode,
    /// Bytes of option data that follow.
    pub length: u32,
}

impl OptionHeaderRepr {
    /// Parses an option header.
    ///
    /// # Errors
    /// [`Error::BadMagic`] unless the magic is `IHAVEOPT`.
    pub fn parse<T: AsRef<[u8]>>(p: &OptionHeader<T>) -> Result<OptionHeaderRepr, Error> {
        if p.magic() != IHAVEOPT {
            return Err(Error::BadMagic {
                what: "option",
                value: p.magic(),
            });
        }
        Ok(OptionHeaderRepr {
            option: p.option().into(),
            length: p.length(),
        })
    }

    /// Bytes emitted.
    pub fn buffer_len(&self) -> usize {
        OptionHeader::<&[u8]>::LEN
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut OptionHeader<T>) {
        p.set_magic(IHAVEOPT);
        p.set_option(self.option.into());
        p.set_length(self.length);
    }
}

/// An option reply header's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReplyRepr {
    /// The option answered.
    pub option: OptionCode,
    /// The reply type.
    pub reply_type: ReplyType,
    /// Bytes of reply data that follow.
    pub length: u32,
}

impl OptionReplyRepr {
    /// Parses an option reply header.
    ///
    /// # Errors
    /// [`Error::BadMagic`] on a wrong magic.
    pub fn parse<T: AsRef<[u8]>>(p: &OptionReply<T>) -> Result<OptionReplyRepr, Error> {
        if p.magic() != OPTION_REPLY_MAGIC {
            return Err(Error::BadMagic {
                what: "option reply",
                value: p.magic(),
            });
        }
        Ok(OptionReplyRepr {
            option: p.option().into(),
            reply_type: p.reply_type().into(),
            length: p.length(),
        })
    }

    /// Bytes emitted.
    pub fn buffer_len(&self) -> usize {
        OptionReply::<&[u8]>::LEN
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut OptionReply<T>) {
        p.set_magic(OPTION_REPLY_MAGIC);
        p.set_option(self.option.into());
        p.set_reply_type(self.reply_type.into());
        p.set_length(self.length);
    }

    /// Appends this header and `data` (whose length must be `self.length`)
    /// to `out`.
    pub fn push(&self, data: &[u8], out: &mut Vec<u8>) {
        debug_assert_eq!(data.len(), self.length as usize);
        let at = out.len();
        out.resize(at + self.buffer_len(), 0);
        self.emit(&mut OptionReply::new_unchecked(&mut out[at..]));
        out.extend_from_slice(data);
    }
}

/// Longest export name or other string (proto.md "Conventions").
pub const MAX_STRING: usize = 4096;

fn string(what: &'static str, bytes: &[u8]) -> Result<String, Error> {
    if bytes.len() > MAX_STRING {
        return Err(Error::Malformed {
            what,
            detail: format!("{} bytes, over {MAX_STRING}", bytes.len()),
        });
    }
    if bytes.contains(&0) {
        return Err(Error::Malformed {
            what,
            detail: "contains NUL".into(),
        });
    }
    String::from_utf8(bytes.to_vec()).map_err(|_| Error::Malformed {
        what,
        detail: "not UTF-8".into(),
    })
}

/// The data of `NBD_OPT_INFO` and `NBD_OPT_GO` (proto.md "Option types"):
/// name length, name, request count, requested info types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoRepr {
    /// Export name; empty for the default export.
    pub name: String,
    /// Information types requested.
    pub requests: Vec<InfoType>,
}

impl GoRepr {
    /// Parses option data.
    ///
    /// # Errors
    /// Truncation, inconsistent lengths, a bad name, or trailing bytes.
    pub fn parse(data: &[u8]) -> Result<GoRepr, Error> {
        truncated("NBD_OPT_GO data", 6, data.len())?;
        let name_len = be32(data, 0..4) as usize;
        // name_len <= data.len() - 6 (proto.md), checked without overflow.
        if name_len > data.len() - 6 {
            return Err(Error::Malformed {
                what: "NBD_OPT_GO name length",
                detail: format!("{name_len} with {} bytes of data", data.len()),
            });
        }
        let name = string("export name", &data[4..4 + name_len])?;
        let rest = &data[4 + name_len..];
        let count = be16(rest, 0..2) as usize;
        if rest.len() - 2 != count * 2 {
            return Err(Error::Malformed {
                what: "NBD_OPT_GO information requests",
                detail: format!("{count} requests in {} bytes", rest.len() - 2),
            });
        }
        let requests = rest[2..]
            .chunks_exact(2)
            .map(|c| InfoType::from(be16(c, 0..2)))
            .collect();
        Ok(GoRepr { name, requests })
    }

    /// Bytes emitted.
    pub fn buffer_len(&self) -> usize {
        4 + self.name.len() + 2 + 2 * self.requests.len()
    }

    /// Appends the option data to `out`.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.name.len() as u32).to_be_bytes());
        out.extend_from_slice(self.name.as_bytes());
        out.extend_from_slice(&(self.requests.len() as u16).to_be_bytes());
        for r in &self.requests {
            out.extend_from_slice(&u16::from(*r).to_be_bytes());
        }
    }
}

/// Block size constraints (proto.md "Size constraints").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSizes {
    /// Minimum block size: alignment of every request.
    pub minimum: u32,
    /// Preferred block size: avoids read-modify-write.
    pub preferred: u32,
    /// Maximum payload of one READ or WRITE.
    pub maximum: u32,
}

/// One information item of an `NBD_REP_INFO` reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InfoRepr {
    /// `NBD_INFO_EXPORT`: size in bytes and transmission flags.
    Export {
        /// Export size in bytes.
        size: u64,
        /// Transmission flags.
        flags: u16,
    },
    /// `NBD_INFO_NAME`.
    Name(String),
    /// `NBD_INFO_BLOCK_SIZE`.
    BlockSize(BlockSizes),
    /// An item this crate does not decode: its type and payload.
    Other(InfoType, Vec<u8>),
}

impl InfoRepr {
    /// Parses the data of an `NBD_REP_INFO` reply.
    ///
    /// # Errors
    /// Truncation or a wrong length for a known type.
    pub fn parse(data: &[u8]) -> Result<InfoRepr, Error> {
        truncated("NBD_REP_INFO", 2, data.len())?;
        let ty = InfoType::from(be16(data, 0..2));
        let body = &data[2..];
        let exact = |n: usize| {
            if body.len() == n {
                Ok(())
            } else {
                Err(Error::Malformed {
                    what: "NBD_REP_INFO length",
                    detail: format!("{ty} with {} bytes", data.len()),
                })
            }
        };
        Ok(match ty {
            InfoType::Export => {
                exact(10)?;
                InfoRepr::Export {
                    size: be64(body, 0..8),
                    flags: be16(body, 8..10),
                }
            }
            InfoType::Name => InfoRepr::Name(string("NBD_INFO_NAME", body)?),
            InfoType::BlockSize => {
                exact(12)?;
                InfoRepr::BlockSize(BlockSizes {
                    minimum: be32(body, 0..4),
                    preferred: be32(body, 4..8),
                    maximum: be32(body, 8..12),
                })
            }
            other => InfoRepr::Other(other, body.to_vec()),
        })
    }

    /// Bytes emitted (the reply header's length field).
    pub fn buffer_len(&self) -> usize {
        2 + match self {
            InfoRepr::Export { .. } => 10,
            InfoRepr::Name(n) => n.len(),
            InfoRepr::BlockSize(_) => 12,
            InfoRepr::Other(_, b) => b.len(),
        }
    }

    /// Appends the reply data to `out`.
    pub fn emit(&self, out: &mut Vec<u8>) {
        let ty = match self {
            InfoRepr::Export { .. } => InfoType::Export,
            InfoRepr::Name(_) => InfoType::Name,
            InfoRepr::BlockSize(_) => InfoType::BlockSize,
            InfoRepr::Other(t, _) => *t,
        };
        out.extend_from_slice(&u16::from(ty).to_be_bytes());
        match self {
            InfoRepr::Export { size, flags } => {
                out.extend_from_slice(&size.to_be_bytes());
                out.extend_from_slice(&flags.to_be_bytes());
            }
            InfoRepr::Name(n) => out.extend_from_slice(n.as_bytes()),
            InfoRepr::BlockSize(b) => {
                out.extend_from_slice(&b.minimum.to_be_bytes());
                out.extend_from_slice(&b.preferred.to_be_bytes());
                out.extend_from_slice(&b.maximum.to_be_bytes());
            }
            InfoRepr::Other(_, b) => out.extend_from_slice(b),
        }
    }
}

/// The server's answer to `NBD_OPT_EXPORT_NAME`: size, transmission flags
/// and, unless `NBD_FLAG_C_NO_ZEROES` was negotiated, 124 zero bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportNameReplyRepr {
    /// Export size in bytes.
    pub size: u64,
    /// Transmission flags.
    pub flags: u16,
}

impl ExportNameReplyRepr {
    /// Zero padding when `NBD_FLAG_C_NO_ZEROES` is not negotiated.
    pub const ZEROES: usize = 124;

    /// Parses the first 10 bytes (the padding is not inspected).
    ///
    /// # Errors
    /// Truncation.
    pub fn parse(data: &[u8]) -> Result<ExportNameReplyRepr, Error> {
        truncated("export name reply", 10, data.len())?;
        Ok(ExportNameReplyRepr {
            size: be64(data, 0..8),
            flags: be16(data, 8..10),
        })
    }

    /// Bytes emitted.
    pub fn buffer_len(&self, no_zeroes: bool) -> usize {
        10 + if no_zeroes { 0 } else { Self::ZEROES }
    }

    /// Appends the reply to `out`.
    pub fn emit(&self, no_zeroes: bool, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.size.to_be_bytes());
        out.extend_from_slice(&self.flags.to_be_bytes());
        if !no_zeroes {
            out.extend_from_slice(&[0; Self::ZEROES]);
        }
    }
}

/// A request header's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestRepr {
    /// Command flags ([`command_flags`]).
    pub flags: u16,
    /// The command.
    pub command: Command,
    /// Opaque handle echoed in the reply.
    pub cookie: u64,
    /// Byte offset into the export.
    pub offset: u64,
    /// Byte length (of the WRITE payload, READ data or affected range).
    pub length: u32,
}

impl RequestRepr {
    /// Parses a request header.
    ///
    /// # Errors
    /// [`Error::BadMagic`] unless the magic is `NBD_REQUEST_MAGIC`.
    pub fn parse<T: AsRef<[u8]>>(p: &Request<T>) -> Result<RequestRepr, Error> {
        if p.magic() != REQUEST_MAGIC {
            return Err(Error::BadMagic {
                what: "request",
                value: u64::from(p.magic()),
            });
        }
        Ok(RequestRepr {
            flags: p.flags(),
            command: p.command().into(),
            cookie: p.cookie(),
            offset: p.offset(),
            length: p.length(),
        })
    }

    /// Bytes emitted (the header only).
    pub fn buffer_len(&self) -> usize {
        Request::<&[u8]>::LEN
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Request<T>) {
        p.set_magic(REQUEST_MAGIC);
        p.set_flags(self.flags);
        p.set_command(self.command.into());
        p.set_cookie(self.cookie);
        p.set_offset(self.offset);
        p.set_length(self.length);
    }

    /// Bytes of payload that follow this header on the wire.
    pub fn payload_len(&self) -> u32 {
        if self.command == Command::Write {
            self.length
        } else {
            0
        }
    }
}

/// A simple reply header's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimpleReplyRepr {
    /// `None` for success.
    pub error: Option<Errno>,
    /// The request's handle.
    pub cookie: u64,
}

impl SimpleReplyRepr {
    /// Parses a simple reply header.
    ///
    /// # Errors
    /// [`Error::BadMagic`] on a wrong magic.
    pub fn parse<T: AsRef<[u8]>>(p: &SimpleReply<T>) -> Result<SimpleReplyRepr, Error> {
        if p.magic() != SIMPLE_REPLY_MAGIC {
            return Err(Error::BadMagic {
                what: "simple reply",
                value: u64::from(p.magic()),
            });
        }
        let error = match p.error() {
            0 => None,
            e => Some(Errno::from(e)),
        };
        Ok(SimpleReplyRepr {
            error,
            cookie: p.cookie(),
        })
    }

    /// Bytes emitted (the header only).
    pub fn buffer_len(&self) -> usize {
        SimpleReply::<&[u8]>::LEN
    }

    /// Writes the header.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut SimpleReply<T>) {
        p.set_magic(SIMPLE_REPLY_MAGIC);
        p.set_error(self.error.map_or(0, u32::from));
        p.set_cookie(self.cookie);
    }

    /// Appends the header to `out`.
    pub fn push(&self, out: &mut Vec<u8>) {
        let at = out.len();
        out.resize(at + self.buffer_len(), 0);
        self.emit(&mut SimpleReply::new_unchecked(&mut out[at..]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greeting_bytes() {
        let bytes: [u8; 18] = [
            0x4e, 0x42, 0x44, 0x4d, 0x41, 0x47, 0x49, 0x43, // "NBDMAGIC"
            0x49, 0x48, 0x41, 0x56, 0x45, 0x4f, 0x50, 0x54, // "IHAVEOPT"
            0x00, 0x03, // FIXED_NEWSTYLE | NO_ZEROES
        ];
        let repr = GreetingRepr::parse(&Greeting::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(
            repr.flags,
            handshake_flags::FIXED_NEWSTYLE | handshake_flags::NO_ZEROES
        );
        let mut out = [0u8; 18];
        repr.emit(&mut Greeting::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        let mut bad = bytes;
        bad[0] = b'X';
        assert!(matches!(
            GreetingRepr::parse(&Greeting::new_unchecked(&bad[..])),
            Err(Error::BadMagic {
                what: "NBDMAGIC",
                ..
            })
        ));
        assert!(Greeting::new_checked(&bytes[..17]).is_err());
    }

    #[test]
    fn option_header_bytes() {
        let bytes: [u8; 16] = [
            0x49, 0x48, 0x41, 0x56, 0x45, 0x4f, 0x50, 0x54, // "IHAVEOPT"
            0x00, 0x00, 0x00, 0x07, // NBD_OPT_GO
            0x00, 0x00, 0x00, 0x0a, // 10 bytes of data
        ];
        let repr =
            OptionHeaderRepr::parse(&OptionHeader::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(
            repr,
            OptionHeaderRepr {
                option: OptionCode::Go,
                length: 10
            }
        );
        let mut out = [0u8; 16];
        repr.emit(&mut OptionHeader::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        assert_eq!(OptionCode::from(99), OptionCode::Unknown(99));
        assert_eq!(OptionCode::Unknown(99).to_string(), "unknown (0x63)");
    }

    #[test]
    fn option_reply_bytes() {
        let bytes: [u8; 20] = [
            0x00, 0x03, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9, // reply magic
            0x00, 0x00, 0x00, 0x08, // NBD_OPT_STRUCTURED_REPLY
            0x80, 0x00, 0x00, 0x01, // NBD_REP_ERR_UNSUP
            0x00, 0x00, 0x00, 0x00, // no data
        ];
        let repr = OptionReplyRepr::parse(&OptionReply::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(repr.option, OptionCode::StructuredReply);
        assert_eq!(repr.reply_type, ReplyType::ErrUnsup);
        assert!(repr.reply_type.is_error() && !ReplyType::Ack.is_error());
        let mut out = Vec::new();
        repr.push(&[], &mut out);
        assert_eq!(out, bytes);
    }

    #[test]
    fn go_data_bytes() {
        let bytes: [u8; 13] = [
            0x00, 0x00, 0x00, 0x03, // name length 3
            b'l', b'u', b'n', // "lun"
            0x00, 0x02, // two information requests
            0x00, 0x03, // NBD_INFO_BLOCK_SIZE
            0x00, 0x09, // unknown type 9, kept
        ];
        let repr = GoRepr::parse(&bytes).unwrap();
        assert_eq!(repr.name, "lun");
        assert_eq!(
            repr.requests,
            vec![InfoType::BlockSize, InfoType::Unknown(9)]
        );
        let mut out = Vec::new();
        repr.emit(&mut out);
        assert_eq!(out, bytes);
        assert_eq!(repr.buffer_len(), bytes.len());
        // Name length pointing past the data, count disagreeing with the
        // rest, trailing byte, too short.
        let mut long_name = bytes;
        long_name[3] = 8;
        assert!(GoRepr::parse(&long_name).is_err());
        assert!(GoRepr::parse(&bytes[..11]).is_err());
        let mut trailing = bytes.to_vec();
        trailing.push(0);
        assert!(GoRepr::parse(&trailing).is_err());
        assert!(GoRepr::parse(&[0, 0, 0, 0, 0]).is_err());
        assert!(GoRepr::parse(&[0xff, 0xff, 0xff, 0xff, 0, 0]).is_err());
        assert_eq!(
            GoRepr::parse(&[0, 0, 0, 0, 0, 0]).unwrap(),
            GoRepr {
                name: String::new(),
                requests: vec![]
            }
        );
    }

    #[test]
    fn info_bytes() {
        let export: [u8; 12] = [
            0x00, 0x00, // NBD_INFO_EXPORT
            0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, // size 1 MiB
            0x01,
            0x6d, // HAS_FLAGS|SEND_FLUSH|SEND_FUA|SEND_TRIM|SEND_WRITE_ZEROES|CAN_MULTI_CONN
        ];
        let repr = InfoRepr::parse(&export).unwrap();
        assert_eq!(
            repr,
            InfoRepr::Export {
                size: 1 << 20,
                flags: 0x016d
            }
        );
        let mut out = Vec::new();
        repr.emit(&mut out);
        assert_eq!(out, export);
        let block: [u8; 14] = [
            0x00, 0x03, // NBD_INFO_BLOCK_SIZE
            0x00, 0x00, 0x00, 0x01, // minimum 1
            0x00, 0x00, 0x10, 0x00, // preferred 4096
            0x02, 0x00, 0x00, 0x00, // maximum 32 MiB
        ];
        let repr = InfoRepr::parse(&block).unwrap();
        assert_eq!(
            repr,
            InfoRepr::BlockSize(BlockSizes {
                minimum: 1,
                preferred: 4096,
                maximum: 32 << 20
            })
        );
        assert_eq!(repr.buffer_len(), 14);
        let mut out = Vec::new();
        repr.emit(&mut out);
        assert_eq!(out, block);
        assert!(InfoRepr::parse(&export[..11]).is_err());
        assert!(InfoRepr::parse(&[0]).is_err());
    }

    #[test]
    fn export_name_reply_bytes() {
        let r = ExportNameReplyRepr {
            size: 0x0102_0304_0506_0708,
            flags: 0x0103,
        };
        let mut out = Vec::new();
        r.emit(true, &mut out);
        assert_eq!(
            out,
            [
                0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // size
                0x01, 0x03, // HAS_FLAGS|READ_ONLY|CAN_MULTI_CONN
            ]
        );
        assert_eq!(ExportNameReplyRepr::parse(&out).unwrap(), r);
        out.clear();
        r.emit(false, &mut out);
        assert_eq!(out.len(), r.buffer_len(false));
        assert_eq!(out.len(), 134);
        assert!(out[10..].iter().all(|&b| b == 0));
    }

    #[test]
    fn request_bytes() {
        let bytes: [u8; 28] = [
            0x25, 0x60, 0x95, 0x13, // NBD_REQUEST_MAGIC
            0x00, 0x01, // FUA
            0x00, 0x01, // NBD_CMD_WRITE
            0xde, 0xad, 0xbe, 0xef, 0x00, 0x00, 0x00, 0x01, // cookie
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, // offset 4096
            0x00, 0x00, 0x02, 0x00, // length 512
        ];
        let repr = RequestRepr::parse(&Request::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(
            repr,
            RequestRepr {
                flags: command_flags::FUA,
                command: Command::Write,
                cookie: 0xdead_beef_0000_0001,
                offset: 4096,
                length: 512
            }
        );
        assert_eq!(repr.payload_len(), 512);
        let mut out = [0u8; 28];
        repr.emit(&mut Request::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        let mut bad = bytes;
        bad[3] = 0x14;
        assert!(matches!(
            RequestRepr::parse(&Request::new_unchecked(&bad[..])),
            Err(Error::BadMagic {
                what: "request",
                value: 0x2560_9514
            })
        ));
        assert_eq!(
            RequestRepr {
                command: Command::Read,
                ..repr
            }
            .payload_len(),
            0
        );
    }

    #[test]
    fn simple_reply_bytes() {
        let bytes: [u8; 16] = [
            0x67, 0x44, 0x66, 0x98, // NBD_SIMPLE_REPLY_MAGIC
            0x00, 0x00, 0x00, 0x1c, // NBD_ENOSPC
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2a, // cookie 42
        ];
        let repr = SimpleReplyRepr::parse(&SimpleReply::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(
            repr,
            SimpleReplyRepr {
                error: Some(Errno::NoSpc),
                cookie: 42
            }
        );
        let mut out = Vec::new();
        repr.push(&mut out);
        assert_eq!(out, bytes);
        let ok = SimpleReplyRepr {
            error: None,
            cookie: 42,
        };
        out.clear();
        ok.push(&mut out);
        assert_eq!(&out[4..8], &[0, 0, 0, 0]);
        assert_eq!(
            SimpleReplyRepr::parse(&SimpleReply::new_unchecked(&out[..])).unwrap(),
            ok
        );
    }

    /// Each table round-trips through its integer and names itself.
    #[test]
    fn tables_round_trip() {
        for c in OptionCode::ALL {
            assert_eq!(OptionCode::from(u32::from(*c)), *c);
            assert!(c.to_string().starts_with("NBD_OPT_"));
        }
        for r in ReplyType::ALL {
            assert_eq!(ReplyType::from(u32::from(*r)), *r);
            assert_eq!(r.is_error(), r.to_string().starts_with("NBD_REP_ERR_"));
        }
        for c in Command::ALL {
            assert_eq!(Command::from(u16::from(*c)), *c);
        }
        for e in Errno::ALL {
            assert_eq!(Errno::from(u32::from(*e)), *e);
        }
        for i in InfoType::ALL {
            assert_eq!(InfoType::from(u16::from(*i)), *i);
        }
    }
}
