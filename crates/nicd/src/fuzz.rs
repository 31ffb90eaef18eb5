//! Bodies of the fuzz targets in `fuzz/`, shared with the deterministic
//! test `tests/fuzz_inputs.rs`: [`frame`] (a frame of the control
//! socket), [`ring_entry`] (an entry of a shared-memory ring) and
//! [`qp1_router`] (MADs from the wire and from clients through the
//! shared QP1's router).
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

/// `data` as steps through one port's [`crate::mads::Router`]: each
/// step an operation byte, a "who" byte, and what the operation takes
/// (a MAD is 256 bytes, from the wire or from a client; a listen, a
/// registration, a client leaving and joining again, a round of
/// resends). Whatever the bytes, no
/// panic, and every MAD the router sends or hands over is whole; a
/// client's MADs that it sends back to the wire as a peer would keep
/// the connection tables in use (tombstones, offers, stamps).
pub fn qp1_router(data: &[u8]) {
    use crate::mads::{Out, Router};
    use rdma_types::Gid;
    let gids = [Gid([0xfe; 16]), Gid::from_ip([127, 91, 9, 9].into())];
    let mut r = Router::new(u32::MAX - 3);
    for c in 1..=3 {
        r.join(c, c == 3);
    }
    let mut d = data;
    let mut take = |n: usize| {
        let (a, b) = d.split_at(n.min(d.len()));
        d = b;
        a
    };
    loop {
        let step = take(2);
        let [op, who] = step else { return };
        let client = u64::from(who % 3) + 1;
        let gid = gids[usize::from(who / 3 % 2)];
        let outs = match op % 6 {
            0 => r.from_wire(gid, 0, take(256)),
            1 => r.from_client(client, gid, 0, take(256)).unwrap_or_default(),
            2 => {
                let b = take(8);
                let sid = b.iter().fold(0u64, |a, x| a << 8 | u64::from(*x)) % 4;
                let _ = r.listen(client, sid, who & 0x80 == 0);
                Vec::new()
            }
            3 => {
                let b = take(4);
                if let [class, version, m @ ..] = b {
                    let _ = r.register(client, *class, *version, m, who & 0x80 == 0);
                }
                Vec::new()
            }
            4 => {
                let outs = r.leave(client);
                r.join(client, who & 1 == 1);
                outs
            }
            _ => r.retransmit(),
        };
        // What went out comes back as a peer's answer would: with the
        // IDs swapped for CM messages, as is for the rest.
        for o in outs {
            if let Out::ToWire { dgid, mut mad, .. } = o {
                if mad[1] == 0x07 {
                    let (a, b) = mad[24..32].split_at_mut(4);
                    a.swap_with_slice(b);
                }
                let _ = r.from_wire(dgid, 0, &mad[..]);
            }
        }
    }
}
