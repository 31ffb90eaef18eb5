//! The transmission phase: one request in, one simple reply out
//! (proto.md "Transmission", "Request types", "Error values").
//!
//! Call order per request: parse the 28-byte header with
//! [`RequestRepr::parse`] (a wrong magic ends the session), ask
//! [`Transmission::payload_len`] how many bytes follow it, read them, then
//! [`Transmission::execute`] appends the reply. Device calls are the only
//! side effect; sockets stay outside.

use crate::volume::Volume;
use crate::wire::{
    command_flags, transmission_flags, BlockSizes, Command, Errno, RequestRepr, SimpleReplyRepr,
};
use crate::Hangup;
use std::sync::Arc;

/// Largest READ or WRITE payload (proto.md "Size constraints": at least
/// 2^25 SHOULD be accepted).
pub const MAX_PAYLOAD: u32 = 32 << 20;

/// What [`Transmission::execute`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A reply was appended; read the next request.
    Replied,
    /// `NBD_CMD_DISC`: no reply; close after sending earlier replies.
    Disconnect,
}

/// The transmission phase of one export.
pub struct Transmission {
    volume: Arc<Volume>,
    read_only: bool,
}

impl Transmission {
    /// Serves `volume`; writes fail with `NBD_EPERM` if `read_only`.
    pub fn new(volume: Arc<Volume>, read_only: bool) -> Transmission {
        Transmission { volume, read_only }
    }

    /// The transmission flags this export advertises.
    pub fn flags(&self) -> u16 {
        use transmission_flags::*;
        if self.read_only {
            HAS_FLAGS | READ_ONLY | SEND_FLUSH | CAN_MULTI_CONN
        } else {
            HAS_FLAGS | SEND_FLUSH | SEND_FUA | SEND_TRIM | SEND_WRITE_ZEROES | CAN_MULTI_CONN
        }
    }

    /// The size constraints advertised: the protocol defaults, with the
    /// device block size as the preferred size (no read-modify-write).
    pub fn block_sizes(&self) -> BlockSizes {
        BlockSizes {
            minimum: 1,
            preferred: self.volume.block_size().max(512),
            maximum: MAX_PAYLOAD,
        }
    }

    /// Bytes of payload that follow `req` on the wire.
    ///
    /// # Errors
    /// [`Hangup::PayloadTooLong`] for a WRITE over [`MAX_PAYLOAD`]: its
    /// payload is not read, so the stream cannot be resynchronised.
    pub fn payload_len(&self, req: &RequestRepr) -> Result<usize, Hangup> {
        match req.payload_len() {
            n if n > MAX_PAYLOAD => Err(Hangup::PayloadTooLong(n)),
            n => Ok(n as usize),
        }
    }

    /// Executes `req` with its `payload`; appends the reply to `out`.
    pub fn execute(&self, req: &RequestRepr, payload: &[u8], out: &mut Vec<u8>) -> Outcome {
        if req.command == Command::Disc {
            return Outcome::Disconnect;
        }
        if req.command == Command::Read {
            self.read(req, out);
            return Outcome::Replied;
        }
        let error = self.command(req, payload).err();
        SimpleReplyRepr {
            error,
            cookie: req.cookie,
        }
        .push(out);
        Outcome::Replied
    }

    fn read(&self, req: &RequestRepr, out: &mut Vec<u8>) {
        let header = out.len();
        let reply = SimpleReplyRepr {
            error: None,
            cookie: req.cookie,
        };
        reply.push(out);
        let result = self
            .check(req, command_flags::FUA, Errno::Inval)
            .and_then(|()| {
                if req.length > MAX_PAYLOAD {
                    return Err(Errno::Inval);
                }
                let at = out.len();
                out.resize(at + req.length as usize, 0);
                self.volume
                    .read(req.offset, &mut out[at..])
                    .map_err(|_| Errno::Io)
            });
        if let Err(e) = result {
            // A simple reply carries no data after an error.
            out.truncate(header);
            SimpleReplyRepr {
                error: Some(e),
                ..reply
            }
            .push(out);
        }
    }

    fn command(&self, req: &RequestRepr, payload: &[u8]) -> Result<(), Errno> {
        use command_flags::{FUA, NO_HOLE};
        let len = u64::from(req.length);
        let writes = matches!(
            req.command,
            Command::Write | Command::Trim | Command::WriteZeroes
        );
        if writes && self.read_only {
            return Err(Errno::Perm);
        }
        match req.command {
            Command::Write => {
                self.check(req, FUA, Errno::NoSpc)?;
                if payload.len() != req.length as usize {
                    return Err(Errno::Inval);
                }
                self.volume
                    .write(req.offset, payload)
                    .map_err(|_| Errno::Io)?;
            }
            Command::Flush => {
                self.flags_ok(req, FUA)?;
                return self.volume.flush().map_err(|_| Errno::Io);
            }
            Command::Trim => {
                self.check(req, FUA, Errno::Inval)?;
                self.volume.trim(req.offset, len).map_err(|_| Errno::Io)?;
            }
            Command::WriteZeroes => {
                self.check(req, FUA | NO_HOLE, Errno::NoSpc)?;
                let may_unmap = req.flags & NO_HOLE == 0;
                self.volume
                    .write_zeroes(req.offset, len, may_unmap)
                    .map_err(|_| Errno::Io)?;
            }
            // CACHE, BLOCK_STATUS, RESIZE are not advertised; unknown
            // commands get EINVAL (proto.md "Error values").
            _ => return Err(Errno::Inval),
        }
        if req.flags & FUA != 0 {
            self.volume.flush().map_err(|_| Errno::Io)?;
        }
        Ok(())
    }

    fn flags_ok(&self, req: &RequestRepr, allowed: u16) -> Result<(), Errno> {
        if req.flags & !allowed != 0 {
            Err(Errno::Inval)
        } else {
            Ok(())
        }
    }

    /// Flags valid for the command and the range inside the export; an
    /// out-of-range request gets `out_of_range`.
    fn check(&self, req: &RequestRepr, allowed: u16, out_of_range: Errno) -> Result<(), Errno> {
        self.flags_ok(req, allowed)?;
        if !self.volume.contains(req.offset, u64::from(req.length)) {
            return Err(out_of_range);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::SimpleReply;
    use blockload::{BlockDevice, RamDevice};
    use std::io;

    /// Every byte's value is a function of its offset, so a misplaced byte
    /// shows.
    fn pattern(offset: u64, len: usize) -> Vec<u8> {
        (0..len as u64)
            .map(|i| ((offset + i) * 7 % 251) as u8 + 1)
            .collect()
    }

    fn tx(bs: u32, blocks: u64, read_only: bool) -> Transmission {
        Transmission::new(
            Arc::new(Volume::new(Arc::new(RamDevice::new(bs, blocks))).unwrap()),
            read_only,
        )
    }

    fn req(command: Command, flags: u16, offset: u64, length: u32) -> RequestRepr {
        RequestRepr {
            flags,
            command,
            cookie: 7,
            offset,
            length,
        }
    }

    /// Runs one request; returns the reply error and the data after it.
    fn run(t: &Transmission, r: RequestRepr, payload: &[u8]) -> (Option<Errno>, Vec<u8>) {
        let mut out = Vec::new();
        assert_eq!(t.execute(&r, payload, &mut out), Outcome::Replied);
        let reply = SimpleReplyRepr::parse(&SimpleReply::new_checked(&out[..]).unwrap()).unwrap();
        assert_eq!(reply.cookie, 7);
        (reply.error, out[16..].to_vec())
    }

    #[test]
    fn write_read_trim_zero_flush() {
        let t = tx(512, 64, false);
        let data = pattern(1000, 5000);
        assert_eq!(
            run(
                &t,
                req(Command::Write, command_flags::FUA, 1000, 5000),
                &data
            ),
            (None, vec![])
        );
        assert_eq!(
            run(&t, req(Command::Read, 0, 1000, 5000), &[]),
            (None, data.clone())
        );
        assert_eq!(run(&t, req(Command::Flush, 0, 0, 0), &[]).0, None);
        assert_eq!(
            run(
                &t,
                req(Command::WriteZeroes, command_flags::NO_HOLE, 2000, 100),
                &[]
            )
            .0,
            None
        );
        let (_, got) = run(&t, req(Command::Read, 0, 1000, 5000), &[]);
        assert_eq!(got[..1000], data[..1000]);
        assert!(got[1000..1100].iter().all(|&b| b == 0));
        assert_eq!(got[1100..], data[1100..]);
        assert_eq!(run(&t, req(Command::Trim, 0, 0, 32768), &[]).0, None);
        let (_, got) = run(&t, req(Command::Read, 0, 0, 32768), &[]);
        assert!(got.iter().all(|&b| b == 0));
    }

    #[test]
    fn errors() {
        let t = tx(512, 8, false); // 4096 bytes
        let e = |r, p: &[u8]| run(&t, r, p).0;
        assert_eq!(e(req(Command::Read, 0, 4000, 97), &[]), Some(Errno::Inval));
        assert_eq!(
            run(&t, req(Command::Read, 0, 4000, 97), &[]).1,
            Vec::<u8>::new()
        );
        assert_eq!(
            e(req(Command::Read, 0, u64::MAX, 1), &[]),
            Some(Errno::Inval)
        );
        assert_eq!(
            e(req(Command::Read, 0, 0, MAX_PAYLOAD + 1), &[]),
            Some(Errno::Inval)
        );
        assert_eq!(e(req(Command::Write, 0, 4096, 1), &[1]), Some(Errno::NoSpc));
        assert_eq!(
            e(req(Command::WriteZeroes, 0, 0, 4097), &[]),
            Some(Errno::NoSpc)
        );
        assert_eq!(e(req(Command::Trim, 0, 4095, 2), &[]), Some(Errno::Inval));
        assert_eq!(
            e(req(Command::Read, command_flags::DF, 0, 1), &[]),
            Some(Errno::Inval)
        );
        assert_eq!(
            e(
                req(Command::WriteZeroes, command_flags::FAST_ZERO, 0, 1),
                &[]
            ),
            Some(Errno::Inval)
        );
        assert_eq!(e(req(Command::Cache, 0, 0, 512), &[]), Some(Errno::Inval));
        assert_eq!(
            e(req(Command::BlockStatus, 0, 0, 512), &[]),
            Some(Errno::Inval)
        );
        assert_eq!(
            e(req(Command::Unknown(77), 0, 0, 512), &[]),
            Some(Errno::Inval)
        );
        let mut out = Vec::new();
        assert_eq!(
            t.execute(&req(Command::Disc, 0, 0, 0), &[], &mut out),
            Outcome::Disconnect
        );
        assert!(out.is_empty());
        assert_eq!(
            t.payload_len(&req(Command::Write, 0, 0, MAX_PAYLOAD)),
            Ok(MAX_PAYLOAD as usize)
        );
        assert_eq!(
            t.payload_len(&req(Command::Write, 0, 0, MAX_PAYLOAD + 1)),
            Err(Hangup::PayloadTooLong(MAX_PAYLOAD + 1))
        );
        assert_eq!(t.payload_len(&req(Command::Read, 0, 0, u32::MAX)), Ok(0));
    }

    #[test]
    fn read_only_refuses_writes() {
        let t = tx(512, 8, true);
        assert_ne!(t.flags() & transmission_flags::READ_ONLY, 0);
        assert_eq!(t.flags() & transmission_flags::SEND_TRIM, 0);
        for c in [Command::Write, Command::Trim, Command::WriteZeroes] {
            assert_eq!(run(&t, req(c, 0, 0, 1), &[0]).0, Some(Errno::Perm));
        }
        assert_eq!(run(&t, req(Command::Read, 0, 0, 1), &[]), (None, vec![0]));
    }

    struct Failing;
    impl BlockDevice for Failing {
        fn block_size(&self) -> u32 {
            512
        }
        fn num_blocks(&self) -> u64 {
            8
        }
        fn read_at(&self, _: u64, _: &mut [u8]) -> io::Result<()> {
            Err(io::Error::other("medium error"))
        }
        fn write_at(&self, _: u64, _: &[u8]) -> io::Result<()> {
            Err(io::Error::other("medium error"))
        }
        fn flush(&self) -> io::Result<()> {
            Err(io::Error::other("cache lost"))
        }
        fn unmap(&self, _: u64, _: u64) -> io::Result<()> {
            Err(io::Error::other("medium error"))
        }
    }

    #[test]
    fn device_errors_are_eio() {
        let t = Transmission::new(Arc::new(Volume::new(Arc::new(Failing)).unwrap()), false);
        assert_eq!(
            run(&t, req(Command::Read, 0, 0, 512), &[]),
            (Some(Errno::Io), vec![])
        );
        assert_eq!(
            run(&t, req(Command::Write, 0, 0, 1), &[1]).0,
            Some(Errno::Io)
        );
        assert_eq!(
            run(&t, req(Command::Flush, 0, 0, 0), &[]).0,
            Some(Errno::Io)
        );
        assert_eq!(
            run(&t, req(Command::Trim, 0, 0, 4096), &[]).0,
            Some(Errno::Io)
        );
        assert_eq!(
            run(&t, req(Command::WriteZeroes, 0, 0, 4096), &[]).0,
            Some(Errno::Io)
        );
    }

    #[test]
    fn fua_and_flush_reach_the_device() {
        let dev = Arc::new(RamDevice::new(512, 8).without_unmap());
        let t = Transmission::new(Arc::new(Volume::new(dev.clone()).unwrap()), false);
        let flushes = || dev.flushes();
        run(&t, req(Command::Write, 0, 0, 1), &[1]);
        assert_eq!(flushes(), 0);
        run(&t, req(Command::Write, command_flags::FUA, 0, 1), &[1]);
        assert_eq!(flushes(), 1);
        run(
            &t,
            req(Command::WriteZeroes, command_flags::FUA, 0, 512),
            &[],
        );
        assert_eq!(flushes(), 2);
        // No unmap on this device: zeroes are written, and TRIM is a no-op.
        assert_eq!(
            run(&t, req(Command::Trim, command_flags::FUA, 0, 4096), &[]).0,
            None
        );
        assert_eq!(flushes(), 3);
        run(&t, req(Command::Flush, 0, 0, 0), &[]);
        assert_eq!(flushes(), 4);
        assert_eq!(run(&t, req(Command::Read, 0, 0, 2), &[]).1, [0, 0]);
    }

    #[test]
    fn advertised_sizes_follow_the_spec_rules() {
        for bs in [512u32, 4096] {
            let b = tx(bs, 8, false).block_sizes();
            assert!(b.minimum.is_power_of_two() && b.minimum <= 65536);
            assert!(b.preferred.is_power_of_two() && b.preferred >= b.minimum.max(512));
            assert!(b.maximum >= b.preferred && b.maximum.is_multiple_of(b.minimum));
            assert_eq!(b.preferred, bs);
        }
    }
}
