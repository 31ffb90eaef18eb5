//! libibverbs for the NIC daemon: a shared library with rdma-core's
//! `libibverbs.so.1` ABI (its SONAME and symbol versions), so Debian's
//! own RDMA binaries, unmodified, run on the soft RoCE NIC of `nicd`
//! when it is found first (`LD_LIBRARY_PATH=DIR`, DIR holding
//! `libibverbs.so.1` as a copy or link of this crate's
//! `libibverbs_abi.so`). No kernel module, no rdma-core package.
//!
//! Covered: rdma-core 44.0 (Debian bookworm) on x86_64, the verbs its
//! `ibv_devinfo`, `ibv_devices`, `ibv_rc_pingpong`, `ibv_ud_pingpong` and
//! perftest (`ib_write_bw`, `ib_read_bw`, `ib_send_bw`, `ib_*_lat`)
//! import: device list, open/close, query device/port/GID/P_Key (with the
//! GID type RoCE v2), PD, MR, completion channels, CQ (poll and arm
//! through the context's ops, events by `ibv_get_cq_event`), SRQ, RC/UC/UD
//! QPs (create, modify, query, destroy; post send/recv through the ops
//! table the header's inline functions call), AH, async events, the
//! `*_str` helpers, `ibv_fork_init`. The layouts are [`abi`], checked
//! against Debian's header by the test `header_layout`; the symbol
//! versions are the `symbols!` lists (what `objdump -T` shows Debian's
//! binaries need), written into a version script by `build.rs`.
//! [`private`] holds what librdmacm and the provider libraries perftest
//! links bind at load (rdma-core's driver interface, refusing).
//!
//! What it refuses: every extended verb (the `verbs_context` before the
//! context is all NULL, so the header's inline `ibv_*_ex` helpers answer
//! `EOPNOTSUPP` or NULL), memory windows, `ibv_create_ah_from_wc`,
//! multicast, `ibv_resize_cq`, `ibv_rereg_mr`, an MR whose I/O virtual
//! address is not its address: each with `EOPNOTSUPP`, never a crash.
//! QP0/QP1 are the daemon's ([`nicd`] refuses them).
//!
//! [`rdmacm`] is librdmacm's connection manager, here so that its ids'
//! contexts, QPs and PDs are this library's; crates/rdmacm-abi's
//! `librdmacm.so.1` gives its functions rdma-core's names and versions.
//!
//! Memory: the application's pages move into a memfd the daemon maps,
//! at the same addresses, when it registers them ([`mr`], where the cost
//! is written down). The data path is the daemon client's: posts and
//! polls through shared-memory rings. Inline sends may come from any
//! memory, as in libibverbs: their bytes are copied at post into a
//! registered bounce buffer of the QP (at most `max_inline_data` each).
//!
//! Configuration, read once at the first `ibv_get_device_list` (this
//! library is the application's edge, as a binary's `main` is): the
//! daemon's socket from `NICD_SOCKET`, else [`nicd::default_socket`].
//! No daemon: an empty device list and one line on stderr saying how to
//! start one (rdma-core prints its warnings there too).

#![deny(clippy::undocumented_unsafe_blocks)]

/// Binds each function to its versioned name, as rdma-core 44 exports
/// it (the version nodes are those `build.rs` writes into the version
/// script, from every `symbols!` list of `src/`). Each module binds its
/// own functions: `.symver` needs the function in the same object. Each
/// function is also exported, unversioned, as `ibverbs_abi_<name>`
/// (`#[export_name]`): a function rustc does not export is local in a
/// release build's object, and so would its versioned name be.
macro_rules! symbols {
    ($($f:ident @ $v:literal),* $(,)?) => {
        std::arch::global_asm!(
            $(concat!(".symver {", stringify!($f), "}, ", stringify!($f), "@@", $v),)*
            $($f = sym $f,)*
        );
        /// The exported names and versions (the tests compare them with
        /// what Debian's binaries import).
        pub const EXPORTS: &[(&str, &str)] = &[$((stringify!($f), $v)),*];
    };
}

/// The library's own allocator (mimalloc), not the application's
/// malloc: registering memory moves the pages around it into a memfd, a
/// copy and then a remap, and a write to those pages in between is lost
/// ([`mr`]). The heap's own bookkeeping lives in those pages, and this
/// library's threads (the NIC's, the daemon client's) would write it on
/// every allocation they free there. With glibc's malloc as Rust's,
/// that is the likely cause of the one heap corruption seen: an
/// `ibv_ud_pingpong` server through this library in an interop run
/// (`shims-rxe`) aborted with `free(): double free detected in tcache 2`.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod abi;
pub mod exports;
pub mod mr;
mod objects;
pub mod private;
pub mod rdmacm;

pub use objects::errno_of;
