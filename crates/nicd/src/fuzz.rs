//! Bodies of the fuzz targets in `fuzz/`, shared with the deterministic
//! test `tests/fuzz_inputs.rs`: [`frame`] (a frame of the control
//! socket) and [`ring_entry`] (an entry of a shared-memory ring).
//!
//! `frame`: Any bytes
//! get a value or an error, never a panic; and the encoding is canonical:
//! a frame that decodes is exactly what encoding its value gives back,
//! except for an error text past the client's cap on kept texts, which
//! decodes as [`proto::TEXTS_OVERFLOW`].

use crate::proto::{self, Answer, Event, Kind, Request};

/// `data` as a frame after its length field, as the daemon (a request)
/// and the client (a response, an event) read it.
pub fn frame(data: &[u8]) {
    let Ok((kind, seq, body)) = proto::split(data) else {
        return;
    };
    let again = match kind {
        Kind::Request => proto::decode::<Request>(body).map(|v| again(kind, seq, v)),
        Kind::Response => proto::decode::<Answer>(body).map(|v| again(kind, seq, v)),
        Kind::Event => proto::decode::<Event>(body).map(|v| again(kind, seq, v)),
    };
    if let Ok((f, shown)) = again {
        if f[4..] != *data {
            assert!(
                shown.contains(proto::TEXTS_OVERFLOW),
                "a decoded frame re-encodes to other bytes: {shown}"
            );
        }
    }
}

/// The frame of `v`, and `v` as `Debug` shows it.
fn again<T: proto::Wire + std::fmt::Debug>(kind: Kind, seq: u32, v: T) -> (Vec<u8>, String) {
    (proto::frame(kind, seq, &v), format!("{v:?}"))
}

/// `data` as a ring entry: its first byte picks what the slot holds (0
/// a send WR, 1 a receive WR, else a completion), the rest is the slot,
/// as the daemon (a WQE) or the client (a CQE) copies it out of the
/// ring. Any bytes decode to a value or an error, never a panic; a
/// value re-encodes to the bytes it was read from.
pub fn ring_entry(data: &[u8]) {
    use crate::ring::{decode_entry, encode_entry};
    use verbs::{RecvWr, SendWr, WorkCompletion};
    let Some((&what, slot)) = data.split_first() else {
        return;
    };
    fn check<T: proto::Wire + std::fmt::Debug>(slot: &[u8]) {
        if let Ok(v) = decode_entry::<T>(slot) {
            let mut b = Vec::new();
            encode_entry(&v, &mut b);
            let len = u32::from_le_bytes(slot[..4].try_into().expect("decoded")) as usize;
            assert!(
                b.get(..4 + len).is_some() && b.get(..4 + len) == slot.get(..4 + len),
                "an entry re-encodes to other bytes: {v:?}"
            );
        }
    }
    match what {
        0 => check::<SendWr>(slot),
        1 => check::<RecvWr>(slot),
        _ => check::<WorkCompletion>(slot),
    }
}
