//! Seeded fault injection and a virtual-clock datagram network.
//!
//! Two pieces, usable apart:
//!
//! - [`FaultInjector`] decides, per datagram, whether it is lost, duplicated,
//!   delayed past its successors (reordered) or corrupted, and whether the link
//!   is down. It is deterministic for a given seed, so a failing run can be
//!   replayed. Drivers (the soft RoCE NIC's UDP driver) use it on real
//!   sockets; the simulator uses it on virtual links.
//! - [`Simulator`] moves datagrams between sans-IO [`SimNode`]s on a virtual
//!   clock that jumps straight to the next deadline, so timeout paths that take
//!   seconds of protocol time run in microseconds of real time.
//!
//! What it refuses to do: read a real clock, touch a socket, or hide which seed
//! produced a run (every outcome follows from the seed and the inputs).

#![forbid(unsafe_code)]

mod fault;
mod rng;
mod sim;

pub use fault::{
    FaultConfig, FaultInjector, FaultSpecError, FaultStats, Outages, Payload, Verdict,
};
pub use rng::Rng;
pub use sim::{Datagram, RunOutcome, SimNode, Simulator};
