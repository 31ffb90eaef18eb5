//! The InfiniBand connection manager protocol (IBA chapter 12), sans-IO.
//!
//! A [`Cm`] is one CM endpoint (one port's GSI agent for the CM class). It
//! keeps every connection's state machine -- active side `REQ sent ->
//! (MRA) -> REP received -> RTU sent -> established`, passive side `REQ
//! received -> (MRA) -> REP sent -> RTU received -> established`, and the
//! disconnect path `DREQ sent / DREQ received -> timewait -> idle` --
//! with the timers and retries of the spec: a request unanswered within its
//! wait is sent again, up to `max_cm_retries` times, then the next path of
//! the list is tried, then the connection fails. The waits come from the
//! path and the REQ ([`Timing`]): twice the path's packet lifetime plus the
//! CM response time of the side that must answer, stretched by an MRA's
//! service timeout. A REQ is resent sooner at first (at most
//! [`REQ_FIRST_RESEND`] of the peer's response time, doubling up to the
//! whole wait), so a login lost on a link that just came back is not held
//! up for the whole wait.
//!
//! Messages are the [`CmMsg`] values the state machines need (comm IDs,
//! QPNs, PSNs, the REQ's partition key, private data, reject reasons);
//! turning them into MAD bytes is the wire layer's job. Call order:
//! [`Cm::connect`] (or [`Cm::connect_req`]) / [`Cm::listen`],
//! [`Cm::handle_msg`] for each CM MAD received, [`Cm::poll_transmit`] until
//! `None`, [`Cm::handle_timeout`] after [`Cm::poll_timeout`], and
//! [`Cm::poll_event`] for what the consumer must act on (accept or reject a
//! REQ, move its QP to RTR/RTS, tear it down).
//!
//! What it refuses to do: touch QPs (the consumer does, on events), read a
//! clock, or pick comm IDs from global randomness (the caller seeds them).

#![forbid(unsafe_code)]

mod cm;
#[doc(hidden)]
pub mod fuzz;

pub use cm::{
    Cm, CmConfig, CmEvent, CmMsg, ConnId, ConnState, MsgKind, RejReason, ReqInfo, Timing,
    REQ_FIRST_RESEND,
};
pub use rdma_types::{CmRetries, TimeoutExp};
