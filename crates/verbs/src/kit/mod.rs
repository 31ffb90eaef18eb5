//! Reusable provider pieces, so every provider (loopback, soft RoCE)
//! applies exactly the same rules.
//!
//! - [`qp_table`]: the QP state-transition table with required/optional
//!   attributes per transition and QP type (IBA 10.3.1, 11.2.5.2).
//! - [`keys`]: L_Key/R_Key table for MRs and MWs with PD, bounds and access
//!   checks (IBA 10.6.3, 10.6.7, 9.7.5.1.3 / C9-88 for R_Key checks).
//! - [`cq`]: completion ring with overflow detection, arm/solicited notify
//!   and a blocking wait that sleeps on a condition variable.
//! - [`rq`]: receive queue / SRQ with the limit event (IBA 11.5.2.3).
//! - [`apm`]: path migration states on modify-QP (IBA 17.2.8).
//! - [`handle_table`]: the slot/generation table behind the typed
//!   handles, so a stale handle is refused the same way everywhere.

pub mod apm;
pub mod cq;
pub mod handle_table;
pub mod keys;
pub mod qp_table;
pub mod rq;
