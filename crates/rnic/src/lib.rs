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
//! Path migration on the loopback: an armed QP moves to its alternate path
//! when forced (RTS->RTS with `Migrated`), when its local primary port
//! goes down, or when a send finds the primary path dead and the
//! alternate alive (the fabric sees both ends, so no retries are spent);
//! an armed peer follows when a migrated QP's packet reaches it on its
//! alternate path (BTH MigReq). Each migration raises `PathMigrated`.
//!
//! What the loopback refuses: zero-based MRs, RNR retry counts 1..=6 are treated as
//! "wait for a receive" (there is no RNR timer), UC READ/atomics
//! (`InvalidArgument`).

#![deny(clippy::undocumented_unsafe_blocks)]

/// Implements trait methods by forwarding each to the inherent method of
/// the same name, `Self::verb(self, ..)`, which a provider keeps in the
/// file of the verb's object. A path finds an inherent method before a
/// trait's, so a forwarder never calls itself (were the inherent method
/// missing, `unconditional_recursion` would say so).
macro_rules! forward_verbs {
    ($(fn $name:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty;)*) => {
        $(
            fn $name(&self $(, $arg: $ty)*) -> $ret {
                Self::$name(self $(, $arg)*)
            }
        )*
    };
}

pub mod loopback;
pub mod softroce;
