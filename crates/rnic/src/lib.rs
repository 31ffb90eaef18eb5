//! Verbs providers.
//!
//! [`loopback`]: in-process CAs attached to one simulated [`loopback::Fabric`].
//! Transfers between QPs are direct copies between registered buffers, with
//! every check the verbs contract asks for (keys, PD, bounds, rights, QP
//! state), done by the shared [`verbs::kit`] pieces so the soft RoCE
//! provider applies the same rules.
//!
//! Loopback contract: every verb executes synchronously inside the call
//! (a SEND completes on both sides before `post_send` returns) except RC
//! messages waiting for a receive (RNR), which wait in the send queue and
//! run when a receive is posted. Callbacks are queued and delivered in
//! order by whichever thread is dispatching, never under an internal lock;
//! `on_destroyed` is queued behind every callback already queued for the
//! object, so it is the last one the consumer sees.
//!
//! [`softroce`]: the soft RoCE NIC (RoCEv2 over UDP, `softroce` crate)
//! behind the same trait; CAs are IP addresses, peers are reached by GID.
//!
//! What the loopback refuses: zero-based MRs, RNR retry counts 1..=6 are treated as
//! "wait for a receive" (there is no RNR timer), alternate paths / path
//! migration (`NotSupported` where asked), UC READ/atomics (`InvalidArgument`).

pub mod loopback;
pub mod softroce;
