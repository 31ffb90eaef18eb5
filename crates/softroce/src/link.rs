//! Following the link under a node's address, as Linux rxe follows its
//! netdev.
//!
//! A node binds a UDP socket to an IP address; the interface holding that
//! address may lose its carrier (a pulled cable, the far end of a veth set
//! down) or be set down. rxe ties its port to the netdev and raises a port
//! error at once (IB_EVENT_PORT_ERR, then IB_EVENT_PORT_ACTIVE when the
//! link returns); without that, a consumer learns of a dead link only when
//! its transport retries run out. [`follow`] gives the provider the same
//! signal: an rtnetlink socket subscribed to link and address changes
//! wakes a thread, which reads the interfaces' state again (`getifaddrs`)
//! and reports each address whose link went down or came back.
//!
//! The thread also looks every [`POLL`] without news: the kernel announces
//! a carrier change through its link watcher, which defers the news of
//! most devices (a physical NIC, a veth whose peer has the same ifindex in
//! its own namespace) to at most one run a second, so a lost carrier can
//! be announced up to a second late (rxe hears it no sooner), while the
//! interface flags `getifaddrs` reads (`IFF_LOWER_UP`) change at once.
//! That periodic look is a cheap one: two `ioctl`s per followed interface
//! (`SIOCGIFFLAGS` for `IFF_UP`, `ETHTOOL_GLINK` for the carrier, which
//! the kernel answers as `IFF_LOWER_UP` is worked out), and a full
//! `getifaddrs` (two netlink dumps, some 50 us with a handful of
//! interfaces, far more in a guest without hardware virtualisation) only
//! when they disagree with the last full look or cannot be asked.
//!
//! The rule, per address: on an interface that is not a loopback one, the
//! link is up when the interface is administratively up and has carrier
//! (`IFF_UP` and `IFF_LOWER_UP`, what rxe checks as `netif_running` and
//! `netif_carrier_ok`); an address seen on such an interface that later is
//! on none (its interface deleted, an IPv6 address flushed at link down)
//! is down. Loopback addresses (127/8, ::1, anything on `lo`) never go
//! down, and an address on no interface when following starts is not
//! followed (the wildcard, or an address not configured yet: the bind
//! would fail anyway).
//!
//! Whether to follow at all is the caller's choice (`rnic` follows unless
//! its options say not to, for instance to measure how long the transport
//! alone takes to notice a dead path); nothing here reads the environment.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Weak;
use std::time::Duration;

/// How often the watcher looks at the interfaces without news (and
/// whether its owner is still there).
pub const POLL: Duration = Duration::from_millis(100);

/// Reads of the netlink socket per wake-up (bounded work; a socket with
/// more wakes the thread again at once).
const DRAIN_READS: usize = 64;

/// The interface that holds an address, as `getifaddrs` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iface {
    /// Interface name.
    pub name: String,
    /// Administratively up (`IFF_UP`).
    pub admin_up: bool,
    /// Has carrier (`IFF_LOWER_UP`).
    pub carrier: bool,
    /// A loopback interface (`IFF_LOOPBACK`).
    pub loopback: bool,
}

impl Iface {
    /// What the port should be: up when set up and with carrier.
    pub fn link_up(&self) -> bool {
        self.admin_up && self.carrier
    }
}

/// The interface holding `addr` now (`None`: no interface has it).
///
/// # Errors
/// `getifaddrs` failed.
pub fn interface_of(addr: IpAddr) -> io::Result<Option<Iface>> {
    Ok(snapshot(&[addr])?.pop().flatten())
}

/// The interface holding each of `addrs`, from one `getifaddrs` call.
fn snapshot(addrs: &[IpAddr]) -> io::Result<Vec<Option<Iface>>> {
    let mut out = vec![None; addrs.len()];
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut cur = head;
    // The list is finite (the kernel's interfaces), but a bound costs
    // nothing.
    for _ in 0..65_536 {
        if cur.is_null() {
            break;
        }
        // SAFETY: cur is a node of the list getifaddrs returned, alive
        // until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        // SAFETY: ifa_addr is null or a sockaddr of the family it names.
        let Some(ip) = (unsafe { ip_of(ifa.ifa_addr) }) else {
            continue;
        };
        for (k, a) in addrs.iter().enumerate() {
            if *a == ip && out[k].is_none() {
                // SAFETY: ifa_name is a NUL-terminated string of the list.
                let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
                let flags = ifa.ifa_flags;
                out[k] = Some(Iface {
                    name: name.to_string_lossy().into_owned(),
                    admin_up: flags & libc::IFF_UP as u32 != 0,
                    carrier: flags & libc::IFF_LOWER_UP as u32 != 0,
                    loopback: flags & libc::IFF_LOOPBACK as u32 != 0,
                });
            }
        }
    }
    // SAFETY: head came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The IP address of a `sockaddr` of family AF_INET or AF_INET6.
///
/// # Safety
/// `sa` is null or points to a sockaddr as large as its family says.
unsafe fn ip_of(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    match i32::from((*sa).sa_family) {
        libc::AF_INET => {
            let v4 = &*(sa as *const libc::sockaddr_in);
            Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr))))
        }
        libc::AF_INET6 => {
            let v6 = &*(sa as *const libc::sockaddr_in6);
            Some(IpAddr::V6(Ipv6Addr::from(v6.sin6_addr.s6_addr)))
        }
        _ => None,
    }
}

/// The link state of each followed address and the rule that turns
/// snapshots into changes (kept apart from the sockets so the rule is
/// tested alone).
#[derive(Debug, Clone)]
struct Tracker {
    /// Per address: `None` not followed (yet), else whether its link is up.
    state: Vec<Option<bool>>,
}

impl Tracker {
    fn new(n: usize) -> Tracker {
        Tracker {
            state: vec![None; n],
        }
    }

    /// Takes a snapshot (one entry per address); returns the addresses
    /// whose link changed and how. The first sight of an address reports
    /// only a link that is down (up is what a port starts as).
    fn update(&mut self, snap: &[Option<Iface>]) -> Vec<(usize, bool)> {
        let mut changes = Vec::new();
        for (k, (old, now)) in self.state.iter_mut().zip(snap).enumerate() {
            let new = match now {
                Some(i) if i.loopback => None,
                Some(i) => Some(i.link_up()),
                // Gone from an interface it was on: that link is no more.
                None if old.is_some() => Some(false),
                None => None,
            };
            if new == *old || new.is_none() {
                continue;
            }
            if old.is_some() || new == Some(false) {
                changes.push((k, new == Some(true)));
            }
            *old = new;
        }
        changes
    }

    fn any(&self) -> bool {
        self.state.iter().any(Option::is_some)
    }
}

/// An rtnetlink socket subscribed to link and address changes.
struct Netlink {
    fd: OwnedFd,
}

impl Netlink {
    fn open() -> io::Result<Netlink> {
        // SAFETY: socket(2) with constant arguments; the result is checked.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an all-zero sockaddr_nl is valid; the fields are set below.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        sa.nl_groups =
            (libc::RTMGRP_LINK | libc::RTMGRP_IPV4_IFADDR | libc::RTMGRP_IPV6_IFADDR) as u32;
        // SAFETY: sa is a valid sockaddr_nl of the length given.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Netlink { fd })
    }

    /// Reads what is queued (the messages themselves do not matter: any
    /// of them means "look again"). An overrun (`ENOBUFS`) lost some, which
    /// the fresh look covers too.
    fn drain(&self) {
        let mut buf = [0u8; 16 << 10];
        for _ in 0..DRAIN_READS {
            // SAFETY: buf is writable for its length.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ENOBUFS) || e.kind() == io::ErrorKind::Interrupted
                {
                    continue;
                }
                return; // EAGAIN: drained
            }
        }
    }
}

/// Sleeps until `fd` has something (data or an error to collect) or
/// `timeout` passes. Returns whether `fd` needs reading.
fn wait(fd: RawFd, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: p is one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    // POLLERR (an overrun) counts: reading collects it.
    r > 0 && p.revents != 0
}

/// `ETHTOOL_GLINK`: the link state, `netif_running && carrier`.
const ETHTOOL_GLINK: u32 = 0x0000_000a;

/// The kernel's `struct ethtool_value`.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// The cheap look: asks the kernel about named interfaces through a
/// socket of this thread's network namespace (unlike `/sys/class/net`,
/// which shows the namespace sysfs was mounted in).
struct Probe {
    fd: OwnedFd,
}

impl Probe {
    fn open() -> io::Result<Probe> {
        // SAFETY: socket(2) with constant arguments; the result is checked.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Probe {
            // SAFETY: fd is a fresh descriptor we own.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Whether interface `name` is administratively up and whether its
    /// link is (what `Iface::admin_up` and `Iface::carrier` hold); `None`
    /// when the kernel cannot say (no such interface, no link state).
    fn state(&self, name: &str) -> Option<(bool, bool)> {
        // SAFETY: an all-zero ifreq is valid (empty name, zero union).
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        let bytes = name.as_bytes();
        if bytes.is_empty() || bytes.len() >= req.ifr_name.len() || bytes.contains(&0) {
            return None;
        }
        for (d, &b) in req.ifr_name.iter_mut().zip(bytes) {
            *d = b as libc::c_char;
        }
        // SAFETY: req is a valid ifreq with a NUL-terminated name; the
        // kernel writes ifru_flags.
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } != 0 {
            return None;
        }
        // SAFETY: SIOCGIFFLAGS filled ifru_flags.
        let flags = i32::from(unsafe { req.ifr_ifru.ifru_flags });
        let mut value = EthtoolValue {
            cmd: ETHTOOL_GLINK,
            data: 0,
        };
        req.ifr_ifru.ifru_data = (&mut value as *mut EthtoolValue).cast();
        // SAFETY: ifru_data points to an ethtool_value the kernel reads
        // the command from and writes the answer to; it outlives the call.
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::SIOCETHTOOL, &mut req) } != 0 {
            return None;
        }
        Some((flags & libc::IFF_UP != 0, value.data != 0))
    }

    /// Whether every followed interface of the last full look is still as
    /// it found it.
    fn agrees(&self, last: &[Option<Iface>]) -> bool {
        last.iter().flatten().filter(|i| !i.loopback).all(|i| {
            self.state(&i.name)
                .is_some_and(|(up, link)| up == i.admin_up && link == i.carrier)
        })
    }
}

/// The watcher's loop: wait for news or POLL, look again (in full after
/// news, or when the cheap look disagrees with the last full one), hand
/// the changes (mostly none) to `deliver` until it says stop.
fn run(
    nl: &Netlink,
    addrs: &[IpAddr],
    tracker: &mut Tracker,
    mut last: Vec<Option<Iface>>,
    mut deliver: impl FnMut(&[(usize, bool)]) -> bool,
) {
    // Without the probe every look is a full one.
    let probe = Probe::open().ok();
    let mut failed = false;
    loop {
        let news = wait(nl.fd.as_raw_fd(), POLL);
        if news {
            nl.drain();
        }
        let full = news || failed || !probe.as_ref().is_some_and(|p| p.agrees(&last));
        // A failed look (out of descriptors, say) reports nothing; the
        // next one, in full, comes within POLL.
        let changes = match full.then(|| snapshot(addrs)) {
            Some(Ok(snap)) => {
                failed = false;
                let changes = tracker.update(&snap);
                last = snap;
                changes
            }
            Some(Err(_)) => {
                failed = true;
                Vec::new()
            }
            None => Vec::new(),
        };
        if !deliver(&changes) {
            return;
        }
    }
}

/// A watcher ready to start: the subscription, the state of the first
/// look and what it found down.
struct Prepared {
    nl: Netlink,
    tracker: Tracker,
    first: Vec<(usize, bool)>,
    /// The first look itself (what the cheap looks compare with).
    snap: Vec<Option<Iface>>,
}

/// The subscription and the first look, in that order, so no change falls
/// between them. `None`: nothing to follow.
fn prepare(addrs: &[IpAddr]) -> io::Result<Option<Prepared>> {
    if addrs.iter().all(|a| a.is_loopback() || a.is_unspecified()) {
        return Ok(None);
    }
    let nl = Netlink::open()?;
    let mut tracker = Tracker::new(addrs.len());
    let snap = snapshot(addrs)?;
    let first = tracker.update(&snap);
    if !tracker.any() {
        return Ok(None);
    }
    Ok(Some(Prepared {
        nl,
        tracker,
        first,
        snap,
    }))
}

/// Follows the links under `addrs` for as long as `owner` lives: calls
/// `on_change(owner, k, up)` when the link under `addrs[k]` goes down or
/// comes back (and at once, before returning, for a link that is down
/// already). A thread of its own waits for rtnetlink news and looks every
/// [`POLL`]; it ends within that of the owner's last reference going.
///
/// Returns whether anything is followed: `false` when no address is on a
/// non-loopback interface.
///
/// # Errors
/// The rtnetlink socket, `getifaddrs` or the thread failed; the caller
/// goes on without following (a dead link is then found by timeouts).
pub fn follow<T: Send + Sync + 'static>(
    owner: Weak<T>,
    addrs: &[IpAddr],
    on_change: impl Fn(&T, usize, bool) + Send + 'static,
) -> io::Result<bool> {
    let Some(Prepared {
        nl,
        mut tracker,
        first,
        snap,
    }) = prepare(addrs)?
    else {
        return Ok(false);
    };
    let Some(o) = owner.upgrade() else {
        return Ok(false);
    };
    for (k, up) in first {
        on_change(&o, k, up);
    }
    drop(o);
    let addrs = addrs.to_vec();
    std::thread::Builder::new()
        .name("softroce-link".into())
        .spawn(move || {
            run(&nl, &addrs, &mut tracker, snap, |changes| {
                let Some(o) = owner.upgrade() else {
                    return false;
                };
                for &(k, up) in changes {
                    on_change(&o, k, up);
                }
                true
            })
        })?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(admin_up: bool, carrier: bool) -> Option<Iface> {
        Some(Iface {
            name: "veth0".into(),
            admin_up,
            carrier,
            loopback: false,
        })
    }

    #[test]
    fn first_sight_reports_only_a_down_link() {
        let mut t = Tracker::new(3);
        let lo = Some(Iface {
            name: "lo".into(),
            admin_up: true,
            carrier: true,
            loopback: true,
        });
        assert_eq!(
            t.update(&[iface(true, true), iface(true, false), lo]),
            [(1, false)]
        );
        // The loopback address is not followed; the other two are.
        assert_eq!(t.state, [Some(true), Some(false), None]);
    }

    #[test]
    fn carrier_and_admin_state_changes_are_reported_once() {
        let mut t = Tracker::new(1);
        assert!(t.update(&[iface(true, true)]).is_empty());
        assert_eq!(t.update(&[iface(true, false)]), [(0, false)]);
        // Still down (now also admin down): no second report.
        assert!(t.update(&[iface(false, false)]).is_empty());
        assert!(t.update(&[iface(false, true)]).is_empty());
        assert_eq!(t.update(&[iface(true, true)]), [(0, true)]);
        assert!(t.update(&[iface(true, true)]).is_empty());
    }

    #[test]
    fn an_address_that_leaves_its_interface_is_down_and_back_when_it_returns() {
        let mut t = Tracker::new(2);
        // Address 1 is on no interface: not followed, even later.
        assert!(t.update(&[iface(true, true), None]).is_empty());
        assert_eq!(t.update(&[None, None]), [(0, false)]);
        assert!(t.update(&[None, None]).is_empty());
        assert_eq!(t.update(&[iface(true, true), None]), [(0, true)]);
        assert_eq!(t.state, [Some(true), None]);
    }

    #[test]
    fn loopback_addresses_need_no_watcher() {
        let addrs = [
            IpAddr::from([127, 0, 173, 1]),
            IpAddr::from(Ipv6Addr::LOCALHOST),
            IpAddr::from([0, 0, 0, 0]),
        ];
        assert!(prepare(&addrs).unwrap().is_none());
        let w = Weak::<()>::new();
        assert!(!follow(w, &addrs, |_, _, _| {}).unwrap());
    }

    #[test]
    fn the_cheap_look_reads_what_the_full_one_reads() {
        let probe = Probe::open().unwrap();
        let lo = interface_of(IpAddr::from([127, 0, 0, 1])).unwrap().unwrap();
        // The loopback device answers ETHTOOL_GLINK (always up).
        assert_eq!(
            probe.state(&lo.name),
            Some((lo.admin_up, lo.carrier)),
            "{lo:?}"
        );
        assert_eq!(probe.state("no-such-if0"), None);
        assert_eq!(probe.state("a-name-far-too-long-for-ifreq"), None);
        // Compared as a followed interface would be.
        let followed = |carrier| {
            Some(Iface {
                loopback: false,
                carrier,
                ..lo.clone()
            })
        };
        assert!(probe.agrees(&[followed(true), None]));
        assert!(!probe.agrees(&[followed(false)]));
        // An interface it cannot ask calls for a full look.
        let gone = Some(Iface {
            name: "no-such-if0".into(),
            ..followed(true).unwrap()
        });
        assert!(!probe.agrees(&[gone]));
    }

    #[test]
    fn the_loopback_interface_is_found_and_never_followed() {
        let lo = interface_of(IpAddr::from([127, 0, 0, 1])).unwrap();
        let lo = lo.expect("127.0.0.1 is on the loopback interface");
        assert!(lo.loopback, "{lo:?}");
        assert!(interface_of(IpAddr::from([192, 0, 2, 77]))
            .unwrap()
            .is_none());
    }
}
