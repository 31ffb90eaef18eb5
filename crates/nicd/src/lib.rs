//! The NIC daemon: one process per host owns the soft RoCE NICs (a UDP
//! port 4791 per address), and every other process reaches them through
//! a client provider, the seeds' kernel access layer and user-mode
//! access layer, in user space (DESIGN.md, "Second stage").
//!
//! - [`proto`]: the control socket's protocol (frames, the hello and its
//!   version, one request per verb, events), and the layout of the
//!   shared-memory rings of the data path (version 2).
//! - [`ring`]: a view of one ring, for both ends.
//! - [`server`]: the daemon. Clients on a Unix stream socket, known by
//!   their credentials (`SO_PEERCRED`); each client's objects in a table
//!   of handles of its own; every verb forwarded to the in-process
//!   provider (the soft RoCE NIC); a client's whole resource tree
//!   released, children first, when its connection ends.
//! - [`client`]: [`NicdProvider`], the `verbs::Provider` that sends each
//!   slow-path verb over the socket, posts and polls through the rings,
//!   and runs the consumer's handlers on a thread of its own (a ring
//!   CQ's on another, woken by an eventfd the daemon writes). Registered
//!   memory and rings are memfds the daemon maps
//!   (`verbs::MemBuf::new_shared`), passed with `SCM_RIGHTS`.
//! - [`mads`]: the MAD services of each port, sans-IO: the daemon owns
//!   the port's QP1 and routes each MAD to the client it belongs to (CM
//!   REQs by listened service ID, other CM messages by the communication
//!   ID the daemon gave the client's connection, responses by a
//!   transaction ID it stamped, unsolicited requests by registered
//!   class and method). A client's GSI QP is its place at that QP1,
//!   served by the client provider, so the access layer's CM, SA client
//!   and DM agent (`rdma-access`) run in the client unchanged: the CM
//!   state machine stays in one place. A client that goes has its
//!   connections ended by the daemon (DREQ, or REJ half way).
//! - [`shared`]: each RoCE NIC's UDP port is a `SO_REUSEPORT` group whose
//!   kernel-side program steers each datagram by its QP number's block;
//!   the daemon lends a client a member and a block
//!   ([`Request::SharePort`](proto::Request)).
//! - [`Direct`] (`client::direct`): the client with its QPs' transport in
//!   its own process, on a lent member (the data path of a NIC of its own,
//!   no hand-off to the daemon); QP1, port attributes, limits and
//!   registrations' accounting stay the daemon's. Every tool's default
//!   ([`data_here`], [`data_path`]); `NICD_DATA=daemon` keeps the QPs in
//!   the daemon, behind the rings.
//! - [`ondemand`]: a tool's `--nicd` starts the daemon when none
//!   answers (one daemon however many tools start at once, under a lock
//!   beside the socket), which leaves after `--idle-exit` without a
//!   client.
//! - [`choice`]: which NIC a tool runs on. The daemon's is the default
//!   (srptd, srpd, srp, rperf, rpingpong, rrping, rperftest, ibstat);
//!   `--own-nic`, `NICD_MODE=own` or an option only a NIC of the tool's own
//!   honours give one in the tool's process.
//! - [`connect_at`] and [`socket_for`]: what the tools' `--nicd [SOCKET]`
//!   option and the default use.
//!
//! When the daemon dies, its clients hear the removal of every open CA
//! and [`NicdProvider`] connects again once one is back (srpd and srptd
//! then start their CM agents and target ports anew).
//!
//! A running daemon serves a NIC at another address when a client of
//! root or the daemon's user asks ([`Request::AddNic`](proto::Request),
//! [`NicdProvider::add_nic_on`] on a fabric; [`connect_at`] asks for the
//! address and fabric it is given), as `rdma link add` makes an rxe
//! device.
//!
//! `nicd --ib-ip IP` (every `--ip` with `--fabric ib`) makes a port one
//! of a managed subnet: it waits in INIT until a subnet manager (`ibsm
//! run --node IP`) brings it ACTIVE with a LID. One daemon serves such
//! ports beside RoCE ones, each at an address of its own. The daemon
//! answers the SM itself: each `ib` port's SMA (`rdma_access::IbNode`)
//! runs on a client of the daemon's own, which holds the port's QP0 and
//! starts before any other client is served. A privileged client that
//! asks for a QP0 (a subnet manager, `ibsm run`) is lent it: the SMA of
//! that port stops, and starts again when the client's QP0 is gone
//! ([`server::Qp0Keeper`]).
//!
//! What it does not do yet: UD sends, atomics and window binds go on
//! the socket, not the rings (as do a solicited-only arm and what it
//! delegates); SIDR through the daemon.
//!
//! What it refuses: a client's handle that is not its own, memory not
//! shared with it, QP0 (and a QP0 another holds to anyone), QP1 MADs it
//! may not send (SMPs, responses of a class it does not serve, CM
//! messages for another client's connections), serving subnet
//! administration or performance management, and port changes, from
//! users other than root and its own, a method or service another
//! client serves or listens on, QPs and registered memory beyond a
//! client's [`Limits`].

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod choice;
pub mod client;
mod efd;
pub mod fuzz;
pub mod mads;
pub mod ondemand;
pub mod proto;
pub mod ring;
pub mod server;
pub mod shared;
mod sock;

pub use client::direct::Direct;
pub use client::{ConnectError, NicdProvider};
/// The fabric of a NIC of the daemon ([`connect_at`], `nicd --ib-ip`).
pub use rdma_access::subnet::Fabric;
pub use server::{ClientReport, Limits, Peer, Server};

use std::path::PathBuf;

/// The environment variable that names the daemon's socket (read by the
/// binaries, never by this library).
pub const SOCKET_ENV: &str = "NICD_SOCKET";

/// The daemon's socket when nothing names another: `/run/nicd.sock` for
/// root, else `nicd.sock` in the user's runtime directory
/// (`$XDG_RUNTIME_DIR`, given as `runtime_dir`), else
/// `$TMPDIR/nicd-<uid>.sock`.
pub fn default_socket(euid: u32, runtime_dir: Option<PathBuf>) -> PathBuf {
    match (euid, runtime_dir) {
        (0, _) => PathBuf::from("/run/nicd.sock"),
        (_, Some(d)) if !d.as_os_str().is_empty() => d.join("nicd.sock"),
        (uid, _) => std::env::temp_dir().join(format!("nicd-{uid}.sock")),
    }
}

/// clap's parser of a tool's `--nicd [SOCKET]`: any path, and the empty
/// one the option without a value stands for (clap's own path parser
/// refuses it).
///
/// # Errors
/// None.
pub fn socket_arg(s: &str) -> Result<PathBuf, std::convert::Infallible> {
    Ok(PathBuf::from(s))
}

/// The daemon's socket a tool's `--nicd [SOCKET]` names: `given`
/// unless empty (the option without a value), else `$NICD_SOCKET`, else
/// [`default_socket`] for this user.
pub fn socket_for(given: &std::path::Path) -> PathBuf {
    if !given.as_os_str().is_empty() {
        return given.to_owned();
    }
    if let Some(s) = std::env::var_os(SOCKET_ENV).filter(|s| !s.is_empty()) {
        return s.into();
    }
    default_socket(
        euid(),
        std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
    )
}

/// A tool's client of the daemon at `socket` and the GUID of the NIC it
/// serves at `ip` (`rnic::softroce::ip_guid`, as `nicd --ip` names it)
/// on `fabric` (`None`: whichever it serves there, a new one on the
/// daemon's `--fabric`). A daemon that serves no NIC there is asked to
/// add one ([`NicdProvider::add_nic_on`]: for root and the daemon's own
/// user).
///
/// # Errors
/// No daemon there; its NIC at `ip` on the other fabric; or one serving
/// other addresses that would not add this one: in words that say what
/// to do.
pub fn connect_at(
    socket: &std::path::Path,
    ip: std::net::IpAddr,
    fabric: Option<rdma_access::subnet::Fabric>,
) -> Result<(std::sync::Arc<NicdProvider>, rdma_types::Guid), String> {
    use verbs::Provider;
    let p = NicdProvider::connect(socket).map_err(|e| e.to_string())?;
    let guid = rnic::softroce::ip_guid(ip);
    let served = p.list_cas();
    let added = match fabric {
        None if served.contains(&guid) => return Ok((p, guid)),
        None => p.add_nic(ip),
        Some(f) => p.add_nic_on(ip, f),
    };
    match added {
        Ok(added) if added == guid => Ok((p, guid)),
        Ok(other) => Err(format!(
            "the NIC daemon at {} (pid {}) added a NIC at {ip} as {:#018x}, not {:#018x}: is it \
             another build of nicd?",
            socket.display(),
            p.daemon_pid(),
            other.0,
            guid.0
        )),
        // Its NIC there is on the other fabric.
        Err(verbs::VerbsError::InvalidArgument(why)) if served.contains(&guid) => Err(format!(
            "{why} (the NIC daemon at {}, pid {})",
            socket.display(),
            p.daemon_pid()
        )),
        Err(e) => {
            let others: Vec<String> = served.iter().map(|g| format!("{:#018x}", g.0)).collect();
            Err(format!(
                "the NIC daemon at {} (pid {}) serves no NIC at {ip} (its NICs: {}) and would not \
                 add one ({e}): give --nicd another socket (a daemon is started there for {ip}), \
                 or restart this one with every address (`nicd --ip ... --ip {ip}`)",
                socket.display(),
                p.daemon_pid(),
                if others.is_empty() {
                    "none".into()
                } else {
                    others.join(", ")
                }
            ))
        }
    }
}

/// The environment variable binaries read with [`data_here`]:
/// `NICD_DATA=daemon` keeps a tool's QPs in the daemon, behind the
/// shared-memory rings, instead of in the tool's process on a member of
/// the daemon's shared port ([`Direct`], the default).
pub const DATA_ENV: &str = "NICD_DATA";

/// For binaries: whether the QPs run in this process (unless `NICD_DATA`
/// says `daemon`).
pub fn data_here() -> bool {
    std::env::var_os(DATA_ENV).is_none_or(|v| v != "daemon")
}

/// The provider a tool uses over the daemon's client `p`: with `here`,
/// [`Direct`] (the data path in this process, on members of the
/// daemon's shared ports), else `p` itself (every QP in the daemon).
///
/// The node of `Direct` takes the soft RoCE options a tool's own NIC
/// takes from its environment (`SOFTROCE_GSO`, `SOFTROCE_FAULTS`:
/// `rnic::softroce::NicOptions::from_env`); with a fault spec it cannot
/// read, it says so and takes the defaults.
pub fn data_path(
    p: std::sync::Arc<NicdProvider>,
    here: bool,
) -> std::sync::Arc<dyn verbs::Provider> {
    if here {
        direct(p)
    } else {
        p
    }
}

/// For binaries: [`Direct`] over the daemon's client `p`, its node with
/// the options of this process's environment (see [`data_path`]).
pub fn direct(p: std::sync::Arc<NicdProvider>) -> std::sync::Arc<Direct> {
    let options = rnic::softroce::NicOptions::from_env().unwrap_or_else(|e| {
        tracing::warn!("{e}: this tool's QPs run with the default soft RoCE options");
        rnic::softroce::NicOptions::default()
    });
    Direct::with_options(p, options)
}

/// This process's effective user ID.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}
