//! A port that cannot carry traffic, said in words that tell the user
//! what to do: its state, and for a RoCE or iWARP port the network
//! interface under it (found in sysfs, as `rdma link` shows it), whose
//! link or MTU is usually the cause.

use std::path::Path;

/// Where sysfs is mounted.
pub(crate) const SYSFS: &str = "/sys";

/// The network interface under port `port` of device `dev`: the netdev
/// of the port's first GID entry that has one
/// (`class/infiniband/<dev>/ports/<port>/gid_attrs/ndevs/<index>`; an
/// InfiniBand port has none). `root` is where sysfs is mounted.
pub(crate) fn netdev(root: &Path, dev: &str, port: u8) -> Option<String> {
    let dir = root
        .join("class/infiniband")
        .join(dev)
        .join("ports")
        .join(port.to_string())
        .join("gid_attrs/ndevs");
    let mut entries: Vec<(u32, std::path::PathBuf)> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            let index = e.file_name().to_str()?.parse().ok()?;
            Some((index, e.path()))
        })
        .collect();
    entries.sort();
    // An entry without a GID cannot be read (EINVAL); skip those.
    entries.into_iter().find_map(|(_, p)| {
        let n = std::fs::read_to_string(p).ok()?;
        let n = n.trim();
        (!n.is_empty()).then(|| n.to_string())
    })
}

/// The MTU of network interface `netdev` (`class/net/<netdev>/mtu`).
pub(crate) fn netdev_mtu(root: &Path, netdev: &str) -> Option<u32> {
    let s = std::fs::read_to_string(root.join("class/net").join(netdev).join("mtu")).ok()?;
    s.trim().parse().ok()
}

/// `enum ibv_port_state` in the words `ibv_devinfo` uses.
pub(crate) fn state_name(state: i32) -> &'static str {
    match state {
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        5 => "ACTIVE_DEFER",
        _ => "NOP",
    }
}

/// The physical port state (IBA 14.2.5.6 PortPhysicalState), as
/// `ibv_devinfo` names it.
pub(crate) fn phys_state_name(phys: u8) -> &'static str {
    match phys {
        1 => "SLEEP",
        2 => "POLLING",
        3 => "DISABLED",
        4 => "PORT_CONFIGURATION_TRAINING",
        5 => "LINK_UP",
        6 => "LINK_ERROR_RECOVERY",
        7 => "PHY_TEST",
        _ => "unknown",
    }
}

/// `IBV_LINK_LAYER_INFINIBAND`.
pub(crate) const LINK_LAYER_IB: u8 = 1;

/// A port that is not ACTIVE, with what was found about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortDown {
    /// The device (`rxe0`).
    pub device: String,
    /// The port.
    pub port: u8,
    /// Its state (`DOWN`, `INIT`, ...).
    pub state: &'static str,
    /// Its physical state (`DISABLED`, `POLLING`, ...).
    pub phys_state: &'static str,
    /// Whether it is an InfiniBand port (else RoCE or iWARP).
    pub infiniband: bool,
    /// The network interface under it (RoCE, iWARP).
    pub netdev: Option<String>,
}

impl PortDown {
    pub(crate) fn new(
        device: &str,
        port: u8,
        attr: &crate::sys::raw::ibv_port_attr,
        netdev: Option<String>,
    ) -> PortDown {
        PortDown {
            device: device.to_string(),
            port,
            state: state_name(attr.state),
            phys_state: phys_state_name(attr.phys_state),
            infiniband: attr.link_layer == LINK_LAYER_IB,
            netdev,
        }
    }

    /// What to do about it.
    fn advice(&self) -> String {
        let (dev, port) = (&self.device, self.port);
        match (&self.netdev, self.infiniband) {
            (Some(n), _) => format!(
                "its network interface {n} is down or has no carrier: ip link set {n} up \
                 (ip link show {n} must say UP and LOWER_UP)"
            ),
            (None, false) => format!(
                "no network interface is bound to it: rdma link show {dev}/{port} says which \
                 should be"
            ),
            (None, true) if self.state == "DOWN" => format!(
                "its link is down: check the cable and the switch port (ibstat {dev} {port})"
            ),
            (None, true) => "its link is up but no subnet manager has configured it: run one \
                             on the fabric (opensm)"
                .to_string(),
        }
    }
}

impl std::fmt::Display for PortDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "port {} of {} is {} (physical state {}), not ACTIVE: {}",
            self.port,
            self.device,
            self.state,
            self.phys_state,
            self.advice()
        )
    }
}

/// Why a path MTU is refused: it is above the port's active MTU, the
/// largest packet the port carries (for RoCE, what its interface's MTU
/// leaves after the headers).
pub(crate) fn path_mtu_too_large(
    asked: rdma_types::Mtu,
    active: rdma_types::Mtu,
    device: &str,
    port: u8,
    netdev: Option<(String, Option<u32>)>,
) -> String {
    let (on, raise) = match netdev {
        Some((n, Some(mtu))) => (
            format!(" (on {n}, interface MTU {mtu})"),
            format!(", or raise the MTU of {n}"),
        ),
        Some((n, None)) => (format!(" (on {n})"), format!(", or raise the MTU of {n}")),
        None => (String::new(), String::new()),
    };
    format!(
        "path MTU {} is above the active MTU {} of {device} port {port}{on}: give at most {} \
         (and no more than the peer's active MTU){raise}",
        asked.bytes(),
        active.bytes(),
        active.bytes()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::raw::ibv_port_attr;
    use rdma_types::Mtu;

    /// A sysfs tree in a temporary directory, removed on drop.
    struct Tree(std::path::PathBuf);

    impl Tree {
        fn new(name: &str) -> Tree {
            let p = std::env::temp_dir().join(format!("rdmacore-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            Tree(p)
        }
        fn file(&self, rel: &str, text: &str) {
            let p = self.0.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn the_netdev_is_the_first_gid_entry_that_names_one() {
        let t = Tree::new("ndevs");
        let ndevs = "class/infiniband/rxe1/ports/1/gid_attrs/ndevs";
        // Index 10 sorts after 2 by number, not by name.
        t.file(&format!("{ndevs}/10"), "other\n");
        t.file(&format!("{ndevs}/2"), "va\n");
        t.file(&format!("{ndevs}/0"), "");
        t.file("class/net/va/mtu", "1500\n");
        assert_eq!(netdev(&t.0, "rxe1", 1).as_deref(), Some("va"));
        assert_eq!(netdev(&t.0, "rxe1", 2), None);
        assert_eq!(netdev(&t.0, "mlx5_0", 1), None);
        assert_eq!(netdev_mtu(&t.0, "va"), Some(1500));
        assert_eq!(netdev_mtu(&t.0, "vb"), None);
    }

    fn attr(state: i32, phys: u8, link_layer: u8) -> ibv_port_attr {
        ibv_port_attr {
            state,
            phys_state: phys,
            link_layer,
            ..Default::default()
        }
    }

    #[test]
    fn a_port_that_is_not_active_says_why_and_what_to_do() {
        let roce = PortDown::new("rxe0", 1, &attr(1, 3, 2), Some("eth0".into()));
        assert_eq!(
            roce.to_string(),
            "port 1 of rxe0 is DOWN (physical state DISABLED), not ACTIVE: its network \
             interface eth0 is down or has no carrier: ip link set eth0 up (ip link show eth0 \
             must say UP and LOWER_UP)"
        );
        let lost = PortDown::new("rxe0", 1, &attr(1, 3, 2), None);
        assert!(lost
            .to_string()
            .ends_with("rdma link show rxe0/1 says which should be"));
        let no_sm = PortDown::new("mlx5_0", 2, &attr(2, 5, 1), None);
        assert!(no_sm
            .to_string()
            .starts_with("port 2 of mlx5_0 is INIT (physical state LINK_UP)"));
        assert!(no_sm.to_string().contains("subnet manager"), "{no_sm}");
        let cable = PortDown::new("mlx5_0", 1, &attr(1, 2, 1), None);
        assert!(cable.to_string().contains("ibstat mlx5_0 1"), "{cable}");
        assert_eq!(state_name(9), "NOP");
        assert_eq!(phys_state_name(0), "unknown");
    }

    #[test]
    fn a_path_mtu_above_the_port_names_both_and_the_interface() {
        let m = path_mtu_too_large(
            Mtu::Mtu4096,
            Mtu::Mtu1024,
            "rxe1",
            1,
            Some(("va".into(), Some(1500))),
        );
        assert_eq!(
            m,
            "path MTU 4096 is above the active MTU 1024 of rxe1 port 1 (on va, interface MTU \
             1500): give at most 1024 (and no more than the peer's active MTU), or raise the MTU \
             of va"
        );
        let ib = path_mtu_too_large(Mtu::Mtu4096, Mtu::Mtu2048, "mlx5_0", 1, None);
        assert!(ib.ends_with("give at most 2048 (and no more than the peer's active MTU)"));
    }
}
