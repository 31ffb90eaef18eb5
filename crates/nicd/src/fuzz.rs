//! Body of the fuzz target in `fuzz/` (a frame of the control socket),
//! shared with the deterministic test `tests/fuzz_inputs.rs`. Any bytes
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
