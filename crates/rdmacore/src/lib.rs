//! A verbs provider over rdma-core: real RDMA NICs, and Linux's own soft
//! devices (rxe, siw), behind [`verbs::Provider`].
//!
//! # What it does
//!
//! [`RdmaCore`] lists the devices libibverbs finds (a CA's GUID is its
//! node GUID; [`RdmaCore::guid_of`] finds one by its kernel name, `rxe0`),
//! opens them, and serves the verbs over the device's own objects: PDs,
//! CQs, SRQs, RC, UC and UD QPs, address handles, MRs over the consumer's
//! [`verbs::MemBuf`] memory (its address is the virtual address the device
//! is given), memory windows where the device has them, batched post and
//! poll. Every handle is a `verbs::Handle`
//! (index + generation, `verbs::kit::handle_table`) into one table; a
//! stale one is refused with `InvalidHandle`, and a modify-QP is checked
//! against the verbs' transition table (`verbs::kit::qp_table`) before
//! the device sees it, so the refusals read as every provider's.
//!
//! A port's GIDs are shown with the one to use first: position 0 is the
//! entry rdma-core's tools would pick (an IPv4-mapped address, RoCE v2
//! over v1, as perftest does), the other valid entries follow in table
//! order, and a GID index in an address vector is a position in that list
//! (see `gid`). [`Options::gid_index`] forces the device entry to lead.
//!
//! # What it refuses
//!
//! - QP0 (`NotSupported`): the kernel owns it. QP1 is the kernel's too; a
//!   GSI QP here is served through the kernel's user MAD interface
//!   (`/dev/infiniband/umadN`, no library: see `umad` and `provider::gsi`),
//!   so the access layer's DM agent and SA client run over it unchanged.
//!   The CM class stays the kernel CM's: `gsi_listen` is refused and
//!   connections go through the kernel's RDMA CM (`cm`). On a RoCE port a
//!   MAD to the SA is refused ([`NO_SA_ON_ROCE`]): there is none.
//! - Memory windows of a type the device's capability flags do not list
//!   (`NotSupported`; `CaAttr::max_mw` is 0 when it has neither). Where it
//!   has them, a type 1 window is bound by `bind_mw` (an unsignaled bind
//!   WR the driver posts on the QP, applied in send-queue order) and a
//!   type 2 window by a `BindMw` work request; a bind of a type 1 window
//!   outside its MR, or without the rights the MR must give (MW_BIND,
//!   LOCAL_WRITE under a writable window), is refused at once. An MR a
//!   window is bound to is not deregistered or re-registered (`Busy`)
//!   until the provider sees the window unbound (deallocated, bound
//!   elsewhere, its key invalidated by a local invalidate posted or by a
//!   receive polled). A local invalidate of a type 2 window that is not
//!   bound is refused at post (Linux 6.1's rxe would crash on it).
//! - Alternate paths (APM), port control (`modify_port`): `NotSupported`,
//!   not yet served.
//! - A QP asking for more inline data than the device takes: the limit
//!   is `CaAttr::max_inline_data`, found by creating QPs (the device does
//!   not report it) the first time it is needed.
//! - A path MTU above the port's active MTU (the message names both, and
//!   the interface under a RoCE port): the device would take it and drop
//!   the packets that do not fit.
//! - A port that is missing or not ACTIVE, in [`RdmaCore::find_port`]
//!   (what a tool opening `--device NAME[:PORT]` calls first): the error
//!   ([`PortDown`]) says the port's state and what to do, e.g. `ip link
//!   set <netdev> up` with the interface read from sysfs.
//! - An inline send whose bytes are not inside an MR of the CA (the
//!   library copies them from the process' memory at post time).
//! - Whatever the device refuses, with the device's errno in words.
//!
//! # Loading
//!
//! libibverbs is opened at run time with `dlopen` (the `libloading`
//! crate, a small and well-kept wrapper of `dlopen`/`dlsym`), not linked:
//! the workspace builds, and every test runs, on a machine without
//! rdma-core, its headers or its library. There [`RdmaCore::new`] returns
//! a one-line [`LoadError`] naming the package to install, and nothing
//! panics. The ABI is written by hand from rdma-core's `verbs.h` (the
//! `sys` module, the only unsafe code of the crate, each block with its
//! reason); the verbs that `verbs.h` defines inline (post, poll, arm,
//! and the window verbs) call through the context's `ops` table as the
//! header does.
//!
//! # Threads and locks
//!
//! Each `open_ca` gets its own libibverbs context and one event thread,
//! which sleeps in `poll(2)` on the context's async fd, the completion
//! channel of each of its CQs (one channel per CQ) and an eventfd. It
//! turns device events into `on_completion` (for a CQ the consumer armed)
//! and `on_async_event` (port active/error, LID, P_Key and SM changes, QP
//! fatal errors, SQ drained, communication established, CQ errors, SRQ
//! limit, device fatal as `CaRemoval`), always with no lock of the
//! provider held: a handler may call any verb, destroy included.
//! `handlers_nest` is false: handlers run on the event thread only.
//!
//! `wait_cq` sleeps on the event thread's count of the CQ's channel
//! events (a condition variable; see `cq` for why it does not read the
//! channel itself), with the CQ armed; a wait never spins except while
//! the consumer's arm is solicited-only.
//!
//! Destroy is asynchronous as the verbs contract says: the handle dies at
//! once and `on_destroyed` follows when no callback for the object is
//! running: at once, or after the event thread's current callback for it
//! returns (a destroy from another thread waits for that callback; one
//! from inside it is finished by the thread afterwards). The device
//! object itself is freed when its last user lets go (a post in flight
//! holds it), children before parents.
//!
//! One lock guards the handle table; it is never held across a call
//! into a handler, and device calls that may sleep (create, destroy,
//! post, poll) run outside it, on objects kept alive by `Arc`s.

#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod cm;
mod convert;
mod gid;
mod port;
mod provider;
mod spec;
mod sys;
mod umad;

pub use cm::{CmStartError, RdmaCm};
pub use port::PortDown;
pub use provider::NO_SA_ON_ROCE;
pub use provider::{DeviceInfo, DeviceLookupError, Options, RdmaCore};
pub use spec::DeviceSpec;
pub use sys::ucma::RDMA_CM_DEVICE;
pub use sys::{LoadError, LIBIBVERBS};
pub use umad::UmadError;

/// Whether MADs can flow through the kernel on port `port` of device
/// `device` (what a GSI QP there needs): its user MAD device is listed
/// and this process may open it. The error is one line with the fix
/// (`modprobe ib_umad`, permissions).
///
/// # Errors
/// No user MAD module, no device for the port, the file missing or not
/// ours to open.
pub fn user_mad_ready(device: &str, port: u8) -> Result<(), UmadError> {
    sys::umad::UmadFile::open(device, port).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The path a machine without rdma-core takes, whatever this host
    /// has: a library that is not there is a one-line error naming the
    /// package, not a panic.
    #[test]
    fn a_missing_library_says_what_to_install_in_one_line() {
        let opts = Options {
            library: "/nonexistent/libibverbs.so.1".into(),
            ..Options::default()
        };
        let e = match RdmaCore::with_options(opts) {
            Err(e) => e,
            Ok(_) => panic!("loaded a library that does not exist"),
        };
        assert!(matches!(e, LoadError::Missing { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(!msg.contains('\n'), "{msg}");
        assert!(
            msg.starts_with("cannot load /nonexistent/libibverbs.so.1: "),
            "{msg}"
        );
        assert!(msg.contains("apt-get install libibverbs1"), "{msg}");
        assert!(msg.contains("rdma-core"), "{msg}");
    }

    /// A library that loads but is not libibverbs names the missing verb.
    #[test]
    fn a_library_without_the_verbs_names_the_first_one_missing() {
        let opts = Options {
            library: "libc.so.6".into(),
            ..Options::default()
        };
        match RdmaCore::with_options(opts) {
            Err(LoadError::Symbol { symbol, .. }) => assert_eq!(symbol, "ibv_get_device_list"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("libc is not libibverbs"),
        }
    }

    /// With the system's library (when this host has one): the devices it
    /// lists, and a name it does not know named in the error with them.
    #[test]
    fn an_unknown_device_name_lists_the_devices_there_are() {
        let Ok(p) = RdmaCore::new() else {
            // No libibverbs here: the test above covers this host.
            return;
        };
        match p.guid_of("no-such-device0") {
            Err(DeviceLookupError::NoSuchDevice { name, known }) => {
                assert_eq!(name, "no-such-device0");
                let listed: Vec<String> =
                    p.devices().unwrap().into_iter().map(|d| d.name).collect();
                assert_eq!(known, listed);
            }
            // No RDMA in this kernel at all: said so, not a panic.
            Err(DeviceLookupError::NoKernelSupport(m)) => assert!(m.contains("os error 38"), "{m}"),
            Err(e @ DeviceLookupError::List(_)) => assert!(!e.to_string().is_empty()),
            Err(e) => panic!("a name lookup answered {e}"),
            Ok(g) => panic!("found {g:?}"),
        }
        let e = DeviceLookupError::NoSuchDevice {
            name: "rxe9".into(),
            known: vec![],
        };
        assert!(e
            .to_string()
            .starts_with("no RDMA device named rxe9 (rdma-core lists: none; "));
    }

    /// `find_port` of a device that is not there answers as `guid_of`
    /// does (it looks the name up first), before opening anything.
    #[test]
    fn find_port_of_an_unknown_device_is_the_name_lookups_error() {
        let Ok(p) = RdmaCore::new() else {
            return;
        };
        let spec: DeviceSpec = "no-such-device0:2".parse().unwrap();
        let by_name = p.guid_of("no-such-device0").expect_err("no such device");
        assert_eq!(p.find_port(&spec), Err(by_name));
        let e = DeviceLookupError::NoSuchPort {
            name: "rxe0".into(),
            port: 2,
            ports: 1,
        };
        assert_eq!(
            e.to_string(),
            "rxe0 has no port 2 (it has 1, numbered from 1)"
        );
    }
}
