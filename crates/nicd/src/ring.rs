//! The shared-memory rings of protocol version 2: their layout (version
//! 1 of the layout, see [`crate::proto`]) and a view of one ring, for
//! both ends.
//!
//! A ring lives in a memfd the client made ([`MemBuf::new_shared`]) and
//! the daemon maps ([`MemBuf::map_shared`]). The other process may write
//! any byte at any time, so every access here is an 8-byte atomic on an
//! aligned word, as [`MemBuf`]'s own are: entries through
//! [`MemBuf::read_at`]/[`MemBuf::write_at`] (relaxed words), the header
//! words as atomics with the orderings the protocol needs.
//! Nothing read from the other side is trusted: the consumer copies an
//! entry out once and decodes the copy, and reads the producer index once
//! per pass.

pub use crate::proto::RingSpec;
use crate::proto::{Dec, Enc, ProtoError, Wire};
use std::sync::atomic::{AtomicU64, Ordering};
use verbs::MemBuf;

/// `"NRG1"`, little-endian, in the low half of word 0.
pub const MAGIC: u32 = u32::from_le_bytes(*b"NRG1");

/// Where each header word is (bytes from the ring's start); each index
/// on a cache line of its own.
mod field {
    /// Magic (low 32 bits) and entry size (high 32).
    pub const MAGIC_SIZE: usize = 0;
    /// Slots (low 32 bits) and capacity (high 32).
    pub const SLOTS_CAP: usize = 8;
    /// [`super::flags`]: the daemon's, but for `RUNG`.
    pub const FLAGS: usize = 64;
    /// Written by the producer only.
    pub const PRODUCER: usize = 128;
    /// Written by the consumer only.
    pub const CONSUMER: usize = 192;
    /// CQ only, written by the client: `req_notify_cq` sequence.
    pub const ARM: usize = 256;
    /// CQ only, written by the daemon: the arm sequence it last answered
    /// through the client's completion eventfd.
    pub const NOTIFIED: usize = 320;
    /// The first entry.
    pub const ENTRIES: usize = 4096;
}

/// Bits of the flags word (the daemon writes them, but for `RUNG` and
/// `WAITER`, which the client sets).
pub mod flags {
    /// Work queue: the daemon's poller sleeps; a post writes the
    /// doorbell.
    pub const SLEEPING: u64 = 1;
    /// The daemon stopped serving this ring (a bad entry or index, a CQ
    /// overrun): the QP is in the error state or the CQ overran.
    pub const DEAD: u64 = 2;
    /// Work queue: a client saw `SLEEPING` and wrote the doorbell; the
    /// posts after it need not (the daemon clears it before it sets
    /// `SLEEPING` and after it wakes).
    pub const RUNG: u64 = 8;
    /// Work queue: a client sleeps on the consumer index (a futex on its
    /// low 32 bits) until the daemon takes its entries; the daemon
    /// clears it and wakes the client after it moves the index. CQ: a
    /// client sleeps on the producer index (`wait_cq`) until the daemon
    /// moves a completion in.
    pub const WAITER: u64 = 16;
    /// CQ: the client armed solicited-only, so completions stay in the
    /// provider's CQ and reach the client by `PollCq` on the socket
    /// once the ring is empty (the daemon cannot tell a solicited
    /// completion from another).
    pub const DELEGATED: u64 = 4;
}

/// Largest entry accepted.
pub const MAX_ENTRY: u32 = 64 << 10;
/// Most slots accepted.
pub const MAX_SLOTS: u32 = 1 << 16;
/// Largest memfd of rings accepted.
pub const MAX_RINGS_LEN: u64 = 256 << 20;
/// The size of a CQE entry (a `WorkCompletion` takes 46 bytes, its
/// length prefix 4).
pub const CQE_SIZE: u32 = 64;

impl RingSpec {
    /// A ring of at least `capacity` entries of `min_entry` bytes at
    /// `offset`.
    pub fn new(offset: u64, min_entry: usize, capacity: u32) -> RingSpec {
        let capacity = capacity.clamp(1, MAX_SLOTS);
        RingSpec {
            offset,
            entry_size: (min_entry.max(64).next_power_of_two() as u32).min(MAX_ENTRY),
            slots: capacity.next_power_of_two(),
            capacity,
        }
    }

    /// Bytes from `offset` to the ring's end.
    pub fn bytes(&self) -> u64 {
        field::ENTRIES as u64 + self.slots as u64 * self.entry_size as u64
    }

    /// Where the ring's bytes end in its memfd.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.bytes())
    }

    /// Refuses a ring that is cut wrong or does not fit in `len` bytes.
    ///
    /// # Errors
    /// What is wrong, in words.
    pub fn check(&self, len: u64) -> Result<(), String> {
        let pow2 = |v: u32| v != 0 && v.is_power_of_two();
        if !pow2(self.entry_size) || !(64..=MAX_ENTRY).contains(&self.entry_size) {
            return Err(format!(
                "ring entry size {} is not a power of two in 64..={MAX_ENTRY}",
                self.entry_size
            ));
        }
        if !pow2(self.slots) || self.slots > MAX_SLOTS {
            return Err(format!(
                "ring slots {} is not a power of two up to {MAX_SLOTS}",
                self.slots
            ));
        }
        if self.capacity == 0 || self.capacity > self.slots {
            return Err(format!(
                "ring capacity {} not in 1..={}",
                self.capacity, self.slots
            ));
        }
        if !self.offset.is_multiple_of(4096) || self.end() > len {
            return Err(format!(
                "ring at {:#x} ({} bytes) is not page-aligned or ends past the {len}-byte memfd",
                self.offset,
                self.bytes()
            ));
        }
        Ok(())
    }
}

/// One ring in a shared buffer (see the module docs).
pub struct Ring {
    buf: MemBuf,
    spec: RingSpec,
    base: usize,
}

impl Ring {
    /// A view of the ring `spec` in `buf`, which must hold it (checked).
    ///
    /// # Errors
    /// [`RingSpec::check`]'s.
    pub fn new(buf: MemBuf, spec: RingSpec) -> Result<Ring, String> {
        spec.check(buf.len() as u64)?;
        Ok(Ring {
            buf,
            base: spec.offset as usize,
            spec,
        })
    }

    /// Writes the header (the client, once, before passing the memfd).
    pub fn init(&self) {
        let size = MAGIC as u64 | (self.spec.entry_size as u64) << 32;
        self.word(field::MAGIC_SIZE).store(size, Ordering::Relaxed);
        let sc = self.spec.slots as u64 | (self.spec.capacity as u64) << 32;
        self.word(field::SLOTS_CAP).store(sc, Ordering::Relaxed);
    }

    /// The ring's cut.
    pub fn spec(&self) -> RingSpec {
        self.spec
    }

    /// The header word at `off` from the ring's start.
    fn word(&self, off: usize) -> &AtomicU64 {
        let at = self.base + off;
        assert!(
            at.is_multiple_of(8) && at + 8 <= self.buf.len(),
            "ring word in bounds"
        );
        // SAFETY: in bounds and 8-aligned (asserted; the buffer is
        // page-aligned), valid while `self.buf` holds the mapping. Every
        // access to these bytes, in this process and (by the protocol)
        // in the other, is an 8-byte atomic, as `MemBuf`'s contract asks
        // of safe access; no plain view of them exists.
        unsafe { &*self.buf.ptr_at(at).cast::<AtomicU64>() }
    }

    /// The producer index (acquire: entries before it are readable).
    pub fn producer(&self) -> u64 {
        self.word(field::PRODUCER).load(Ordering::Acquire)
    }

    /// Publishes entries up to `i` (release).
    pub fn set_producer(&self, i: u64) {
        self.word(field::PRODUCER).store(i, Ordering::Release);
    }

    /// The consumer index (acquire: the slots before it may be reused).
    pub fn consumer(&self) -> u64 {
        self.word(field::CONSUMER).load(Ordering::Acquire)
    }

    /// Frees slots up to `i` (release: the entries were read before).
    pub fn set_consumer(&self, i: u64) {
        self.word(field::CONSUMER).store(i, Ordering::Release);
    }

    /// Sleeps while the consumer index's low 32 bits are `low`, at most
    /// `timeout` (a futex shared with the other process; any wake-up,
    /// early or spurious, returns).
    pub fn wait_consumer(&self, low: u32, timeout: std::time::Duration) {
        self.futex_wait(field::CONSUMER, low, timeout);
    }

    /// Wakes the clients sleeping in [`Ring::wait_consumer`].
    pub fn wake_consumer(&self) {
        self.futex_wake(field::CONSUMER);
    }

    /// [`Ring::wait_consumer`] on the producer index (a CQ's waiter).
    pub fn wait_producer(&self, low: u32, timeout: std::time::Duration) {
        self.futex_wait(field::PRODUCER, low, timeout);
    }

    /// Wakes the clients sleeping in [`Ring::wait_producer`].
    pub fn wake_producer(&self) {
        self.futex_wake(field::PRODUCER);
    }

    fn futex_wait(&self, off: usize, low: u32, timeout: std::time::Duration) {
        // Clamped: a longer wait (`Duration::MAX`, "for ever") would
        // turn negative as a time_t, which the kernel refuses at once.
        let ts = libc::timespec {
            tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        let w: *const AtomicU64 = self.word(off);
        // SAFETY: the word is mapped, 8-aligned and lives while `self`
        // does; the kernel reads its first (low, little-endian) 4 bytes
        // atomically and writes nothing; `ts` is a live local.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                w.cast::<u32>(),
                libc::FUTEX_WAIT,
                low,
                &ts as *const libc::timespec,
            );
        }
    }

    fn futex_wake(&self, off: usize) {
        let w: *const AtomicU64 = self.word(off);
        // SAFETY: as in `futex_wait`; a wake reads no memory.
        unsafe {
            libc::syscall(libc::SYS_futex, w.cast::<u32>(), libc::FUTEX_WAKE, i32::MAX);
        }
    }

    /// The flags word.
    pub fn flags(&self) -> u64 {
        self.word(field::FLAGS).load(Ordering::SeqCst)
    }

    /// Sets `bits` in the flags word; the word before.
    pub fn set_flags(&self, bits: u64) -> u64 {
        self.word(field::FLAGS).fetch_or(bits, Ordering::SeqCst)
    }

    /// Clears `bits` in the flags word (the daemon).
    pub fn clear_flags(&self, bits: u64) {
        self.word(field::FLAGS).fetch_and(!bits, Ordering::SeqCst);
    }

    /// The CQ's arm sequence.
    pub fn arm(&self) -> u64 {
        self.word(field::ARM).load(Ordering::SeqCst)
    }

    /// Arms the CQ once more (the client).
    pub fn bump_arm(&self) {
        self.word(field::ARM).fetch_add(1, Ordering::SeqCst);
    }

    /// The arm sequence the daemon last answered through the client's
    /// completion eventfd.
    pub fn notified(&self) -> u64 {
        self.word(field::NOTIFIED).load(Ordering::SeqCst)
    }

    /// Answers arm sequence `arm` (the daemon, before it writes the
    /// client's completion eventfd).
    pub fn set_notified(&self, arm: u64) {
        self.word(field::NOTIFIED).store(arm, Ordering::SeqCst);
    }

    fn slot(&self, i: u64) -> usize {
        let slot = (i % self.spec.slots as u64) as usize;
        self.base + field::ENTRIES + slot * self.spec.entry_size as usize
    }

    /// Writes `bytes` (an encoded entry: length prefix and value, see
    /// [`encode_entry`]) into the slot of index `i`; `false` when they
    /// do not fit.
    pub fn write(&self, i: u64, bytes: &[u8]) -> bool {
        if bytes.len() > self.spec.entry_size as usize {
            return false;
        }
        self.buf.write_at(self.slot(i), bytes);
        true
    }

    /// Copies the entry of index `i` out (once) into `out`, which must be
    /// [`RingSpec::entry_size`] bytes long.
    pub fn read(&self, i: u64, out: &mut [u8]) {
        let n = out.len().min(self.spec.entry_size as usize);
        self.buf.read_at(self.slot(i), &mut out[..n]);
    }
}

/// An entry's bytes: `v`'s length (u32 LE) and its [`Wire`] encoding,
/// padded to whole 8-byte words.
pub fn encode_entry<T: Wire>(v: &T, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&[0; 4]);
    let mut e = Enc(std::mem::take(out));
    v.put(&mut e);
    let mut b = e.0;
    let len = (b.len() - 4) as u32;
    b[..4].copy_from_slice(&len.to_le_bytes());
    b.resize(b.len().next_multiple_of(8), 0);
    *out = b;
}

/// The value in an entry's bytes (a copy, never the shared memory).
///
/// # Errors
/// A length past the entry, or what [`crate::proto::decode`] says.
pub fn decode_entry<T: Wire>(entry: &[u8]) -> Result<T, ProtoError> {
    let len = entry
        .get(..4)
        .ok_or(ProtoError::Truncated("ring entry length"))?;
    let len = u32::from_le_bytes(len.try_into().expect("sized")) as usize;
    let body = entry
        .get(4..4usize.saturating_add(len))
        .ok_or(ProtoError::BadValue("ring entry length past the entry"))?;
    let mut d = Dec(body);
    let v = T::get(&mut d)?;
    d.finish()?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_types::{Lid, Qpn, Rkey, WcOpcode, WcStatus};
    use verbs::{SendOpcode, SendWr, Sge, WcFlags, WorkCompletion};

    #[test]
    fn a_completion_fits_its_entry() {
        let mut wc = WorkCompletion::new(u64::MAX, WcStatus::FatalErr, WcOpcode::Recv, u64::MAX);
        wc.byte_len = u32::MAX;
        wc.imm = u32::MAX;
        wc.invalidated_rkey = Rkey(u32::MAX);
        wc.src_qp = Qpn::new(0xff_ffff).unwrap();
        wc.pkey_index = u16::MAX;
        wc.slid = Lid(u16::MAX);
        wc.wc_flags = WcFlags(0xff);
        let mut b = Vec::new();
        encode_entry(&wc, &mut b);
        assert!(b.len() <= CQE_SIZE as usize, "{}", b.len());
        assert_eq!(decode_entry::<WorkCompletion>(&b), Ok(wc));
    }

    #[test]
    fn entries_round_trip_and_lies_are_refused() {
        let w = SendWr::new(
            7,
            SendOpcode::Send,
            vec![Sge {
                addr: 4096,
                length: 64,
                lkey: rdma_types::Lkey(3),
            }],
        );
        let mut b = Vec::new();
        encode_entry(&w, &mut b);
        assert_eq!(b.len() % 8, 0);
        let mut slot = vec![0xee; 256];
        slot[..b.len()].copy_from_slice(&b);
        assert_eq!(decode_entry::<SendWr>(&slot), Ok(w));
        // A length past the slot.
        slot[..4].copy_from_slice(&1000u32.to_le_bytes());
        assert!(decode_entry::<SendWr>(&slot).is_err());
        // A length that leaves bytes of the value out.
        slot[..4].copy_from_slice(&3u32.to_le_bytes());
        assert!(decode_entry::<SendWr>(&slot).is_err());
        assert!(decode_entry::<SendWr>(&[1, 2]).is_err());
    }

    #[test]
    fn specs_out_of_shape_are_refused() {
        let ok = RingSpec::new(0, 100, 5);
        assert_eq!((ok.entry_size, ok.slots, ok.capacity), (128, 8, 5));
        assert!(ok.check(ok.end()).is_ok());
        assert!(ok.check(ok.end() - 1).is_err());
        for bad in [
            RingSpec {
                entry_size: 96,
                ..ok
            },
            RingSpec {
                entry_size: 32,
                ..ok
            },
            RingSpec { slots: 6, ..ok },
            RingSpec { slots: 0, ..ok },
            RingSpec { capacity: 9, ..ok },
            RingSpec { capacity: 0, ..ok },
            RingSpec { offset: 100, ..ok },
            RingSpec {
                offset: u64::MAX - 4095,
                ..ok
            },
        ] {
            assert!(bad.check(1 << 30).is_err(), "{bad:?}");
        }
    }
}
