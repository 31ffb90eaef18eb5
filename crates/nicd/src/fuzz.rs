//! Body of the fuzz target in `fuzz/` (a frame of the control socket),
//! shared with the deterministic test `tests/fuzz_inputs.rs`. Any bytes
//! get a value or an error, never a panic; and the encoding is canonical:
//! a frame that decodes is exactly what encoding its value gives back.

use crate::proto::{self, Answer, Event, Kind, Request};

/// `data` as a frame after its length field, as the daemon (a request)
/// and the client (a response, an event) read it.
pub fn frame(data: &[u8]) {
    let Ok((kind, seq, body)) = proto::split(data) else {
        return;
    };
    let again = match kind {
        Kind::Request => proto::decode::<Request>(body).map(|v| proto::frame(kind, seq, &v)),
        Kind::Response => proto::decode::<Answer>(body).map(|v| proto::frame(kind, seq, &v)),
        Kind::Event => proto::decode::<Event>(body).map(|v| proto::frame(kind, seq, &v)),
    };
    if let Ok(f) = again {
        assert_eq!(&f[4..], data, "a decoded frame re-encodes to other bytes");
    }
}
