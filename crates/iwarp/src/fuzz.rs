//! Bodies of the fuzz targets, shared with deterministic tests so CI runs
//! them without a nightly toolchain, and a small [`TestMemory`] both use.
//!
//! - [`receiver`]: arbitrary bytes, cut into arbitrary chunks, into an
//!   [`FpduReceiver`]; every ULPDU handed out must be whole and checked.
//! - [`connection`]: an established responder (CRC off, so the bytes reach
//!   DDP and RDMAP) fed arbitrary bytes in arbitrary chunks, with posts in
//!   between; it must never panic, and once it has sent a TERMINATE every
//!   work request must have completed.
//! - [`setup`]: arbitrary bytes into a fresh initiator or responder, so the
//!   MPA request/reply parser and negotiation see them first.

use std::collections::HashMap;

use rdma_types::Instant;

use crate::conn::{Access, Connection, Memory, MemoryError};
use crate::mpa::{FpduReceiver, FrameKind, FrameRepr};
use crate::{Config, Role, STag, SendOp, SendWqe, Sge, State};

/// One registered buffer of [`TestMemory`].
#[derive(Debug, Clone)]
pub struct Region {
    /// Tagged offset of the first byte.
    pub base: u64,
    /// The bytes.
    pub data: Vec<u8>,
    /// Remote reads allowed.
    pub remote_read: bool,
    /// Remote writes allowed.
    pub remote_write: bool,
    /// Another stream's STag (refused as not associated).
    pub foreign: bool,
}

/// A memory of STag-keyed regions that checks like an RNIC would.
#[derive(Debug, Clone, Default)]
pub struct TestMemory {
    /// Regions by STag.
    pub regions: HashMap<u32, Region>,
}

impl TestMemory {
    /// Registers `data` under `stag` at tagged offset `base`.
    pub fn register(
        &mut self,
        stag: STag,
        base: u64,
        data: Vec<u8>,
        remote_read: bool,
        remote_write: bool,
    ) {
        self.regions.insert(
            stag.0,
            Region {
                base,
                data,
                remote_read,
                remote_write,
                foreign: false,
            },
        );
    }

    /// The bytes under `stag`.
    pub fn bytes(&self, stag: STag) -> &[u8] {
        self.regions.get(&stag.0).map_or(&[], |r| &r.data)
    }

    fn range(
        &mut self,
        stag: STag,
        to: u64,
        len: usize,
    ) -> Result<(&mut Region, usize), MemoryError> {
        let r = self
            .regions
            .get_mut(&stag.0)
            .ok_or(MemoryError::InvalidStag)?;
        if r.foreign {
            return Err(MemoryError::NotAssociated);
        }
        let off = to.checked_sub(r.base).ok_or(MemoryError::OutOfBounds)?;
        let end = off
            .checked_add(len as u64)
            .ok_or(MemoryError::OutOfBounds)?;
        if end > r.data.len() as u64 {
            return Err(MemoryError::OutOfBounds);
        }
        Ok((r, off as usize))
    }
}

impl Memory for TestMemory {
    fn read_local(&mut self, stag: STag, to: u64, out: &mut [u8]) -> Result<(), MemoryError> {
        let (r, off) = self.range(stag, to, out.len())?;
        out.copy_from_slice(&r.data[off..off + out.len()]);
        Ok(())
    }

    fn write_local(&mut self, stag: STag, to: u64, data: &[u8]) -> Result<(), MemoryError> {
        let (r, off) = self.range(stag, to, data.len())?;
        r.data[off..off + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn remote_check(
        &mut self,
        stag: STag,
        to: u64,
        len: u64,
        access: Access,
    ) -> Result<(), MemoryError> {
        let len = usize::try_from(len).map_err(|_| MemoryError::OutOfBounds)?;
        let (r, _) = self.range(stag, to, len)?;
        let ok = match access {
            Access::RemoteRead => r.remote_read,
            Access::RemoteWrite => r.remote_write,
        };
        if ok {
            Ok(())
        } else {
            Err(MemoryError::NoAccess)
        }
    }

    fn remote_write(&mut self, stag: STag, to: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.remote_check(stag, to, data.len() as u64, Access::RemoteWrite)?;
        self.write_local(stag, to, data)
    }

    fn remote_read(&mut self, stag: STag, to: u64, out: &mut [u8]) -> Result<(), MemoryError> {
        self.remote_check(stag, to, out.len() as u64, Access::RemoteRead)?;
        self.read_local(stag, to, out)
    }

    fn invalidate(&mut self, stag: STag) -> Result<(), MemoryError> {
        self.regions
            .remove(&stag.0)
            .map(|_| ())
            .ok_or(MemoryError::InvalidStag)
    }
}

/// Reads the input front to back; past the end gives zeros.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn u8(&mut self) -> u8 {
        let (b, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        b
    }
    fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
}

/// Fuzz body: byte 0 says whether CRCs are on; then chunks, each a length
/// byte and that many stream bytes. Returns the ULPDUs delivered.
pub fn receiver(data: &[u8]) -> usize {
    let mut input = Input(data);
    let mut rx = FpduReceiver::new(input.u8() & 1 == 1, crate::ddp::TAGGED_HEADER_LEN);
    let mut delivered = 0;
    while !input.0.is_empty() {
        let n = usize::from(input.u8());
        let mut chunk = input.take(n);
        loop {
            match rx.poll(&mut chunk) {
                Ok(Some(u)) => {
                    assert!(u.len() >= crate::ddp::TAGGED_HEADER_LEN);
                    delivered += 1;
                }
                Ok(None) => {
                    assert!(chunk.is_empty());
                    break;
                }
                Err(_) => {
                    // Failed for good: the same error again.
                    assert!(rx.poll(&mut chunk).is_err());
                    return delivered;
                }
            }
        }
    }
    delivered
}

/// An established responder (CRC off) and its memory: STag 1 is a 4 KiB
/// remotely writable and readable buffer, STag 2 a 4 KiB local one for
/// receives and sends.
pub fn established_responder() -> (Connection, TestMemory) {
    let mut mem = TestMemory::default();
    mem.register(STag(1), 0x1000, vec![0; 4096], true, true);
    mem.register(STag(2), 0, vec![0x5a; 4096], false, false);
    let mut cfg = Config::new(Role::Responder);
    cfg.crc = false;
    let mut c = Connection::new(cfg, Instant::ZERO).unwrap_or_else(|e| unreachable!("{e}"));
    let req = FrameRepr::ours(FrameKind::Request, false, 2, Some((4, 4)), &[]);
    let mut b = Vec::new();
    req.emit(&mut b);
    c.handle_bytes(Instant::ZERO, &b, &mut mem);
    c.accept(&[]).unwrap_or_else(|e| unreachable!("{e}"));
    (c, mem)
}

/// Fuzz body: arbitrary bytes into an established responder. Each step is
/// a tag byte: 0-191 a chunk of that many stream bytes, 192-223 post a
/// receive, 224-239 post a send, 240-255 drain the transmit side. Returns
/// the events seen and the number of completions.
pub fn connection(data: &[u8]) -> (Vec<crate::Event>, usize) {
    let (mut c, mut mem) = established_responder();
    let mut input = Input(data);
    let mut out = Vec::new();
    let mut id = 0u64;
    let mut posted = 0usize;
    let mut completed = 0usize;
    let mut events = Vec::new();
    while c.poll_event().is_some() {}
    while !input.0.is_empty() {
        let tag = input.u8();
        match tag {
            0..=191 => {
                let chunk = input.take(usize::from(tag));
                c.handle_bytes(Instant::ZERO, chunk, &mut mem);
            }
            192..=223 => {
                id += 1;
                posted += 1;
                let len = u32::from(input.u8()) * 16;
                c.post_recv(crate::RecvWqe {
                    wr_id: id,
                    buf: Sge {
                        stag: STag(2),
                        to: 0,
                        len,
                    },
                });
            }
            224..=239 => {
                id += 1;
                posted += 1;
                let len = u32::from(input.u8()) * 8;
                let local = Sge {
                    stag: STag(2),
                    to: 0,
                    len,
                };
                c.post_send(SendWqe {
                    wr_id: id,
                    op: SendOp::Send {
                        local,
                        solicited: false,
                        invalidate: None,
                    },
                });
            }
            _ => {
                for _ in 0..64 {
                    out.clear();
                    if !c.poll_transmit(Instant::ZERO, &mut mem, &mut out) {
                        break;
                    }
                }
            }
        }
        while c.poll_completion().is_some() {
            completed += 1;
        }
        events.extend(std::iter::from_fn(|| c.poll_event()));
        if c.state() == State::Terminated {
            assert_eq!(
                posted, completed,
                "every work request completes once terminated"
            );
        }
    }
    (events, completed)
}

/// Fuzz body: arbitrary bytes into a fresh connection, from its MPA
/// exchange on. Byte 0 picks the role (bit 0: initiator) and whether the
/// responder accepts (bit 1) or rejects; then chunks, each a length byte
/// and that many stream bytes. Returns the events seen.
pub fn setup(data: &[u8]) -> Vec<crate::Event> {
    let mut input = Input(data);
    let mode = input.u8();
    let role = if mode & 1 == 1 {
        Role::Initiator
    } else {
        Role::Responder
    };
    let mut mem = TestMemory::default();
    let mut c =
        Connection::new(Config::new(role), Instant::ZERO).unwrap_or_else(|e| unreachable!("{e}"));
    let mut out = Vec::new();
    let mut events = Vec::new();
    while !input.0.is_empty() {
        let n = usize::from(input.u8());
        c.handle_bytes(Instant::ZERO, input.take(n), &mut mem);
        if c.state() == State::RequestReceived {
            if mode & 2 == 2 {
                c.accept(b"ok").unwrap_or_else(|e| unreachable!("{e}"));
            } else {
                c.reject(b"no");
            }
        }
        out.clear();
        while c.poll_transmit(Instant::ZERO, &mut mem, &mut out) {}
        events.extend(std::iter::from_fn(|| c.poll_event()));
    }
    events
}
