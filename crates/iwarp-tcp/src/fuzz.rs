//! Bodies of the fuzz targets (`fuzz/`), shared with the tests that
//! replay their committed inputs.

use crate::rendezvous::Rendezvous;

/// `rendezvous`: any private data parses or is refused; what parses
/// re-emits the same bytes.
pub fn rendezvous(data: &[u8]) {
    if let Some(r) = Rendezvous::parse(data) {
        assert_eq!(r.emit(), data, "round trip");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn committed_inputs_replay() {
        let n = rdma_testkit::fuzz::replay(env!("CARGO_MANIFEST_DIR"), "rendezvous", |d| {
            super::rendezvous(d)
        });
        assert!(n >= 3, "{n} inputs");
    }
}
