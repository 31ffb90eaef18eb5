//! The kernel's user MAD interface (`ib_umad`, uapi `rdma/ib_user_mad.h`)
//! as data: the header in front of every MAD read from or written to
//! `/dev/infiniband/umadN`, the agent registration request, which umad
//! device is which port, and the errors a user can act on. The system
//! calls are `sys::umad`; the GSI QP served over them is
//! `provider::gsi`.
//!
//! Why not libibumad: the interface is one device file, two ioctls and
//! `read`/`write` of a 64-byte header plus the MAD, which needs no
//! library (as `sys::ucma` drives the kernel's RDMA CM without
//! librdmacm), and the default build then needs nothing more than it
//! needs today.
//!
//! The header is the `pkey_index` form (`struct ib_user_mad_hdr`, 64
//! bytes), which the kernel uses for a file whose agents were registered
//! with `IB_USER_MAD_REGISTER_AGENT2`, as ours are. Its first five words
//! are in the host's byte order; `qpn`, `qkey`, `lid` and `flow_label`
//! are big-endian (the kernel's `__be` types).

use rdma_types::Gid;
use std::path::Path;

/// Bytes of the header in front of each MAD.
pub(crate) const HDR_LEN: usize = 64;

/// Bytes of the `IB_USER_MAD_REGISTER_AGENT2` request.
pub(crate) const REG_LEN: usize = 40;

/// Where umad devices are listed (one directory per port).
pub(crate) const SYSFS_UMAD: &str = "/sys/class/infiniband_mad";

mod field {
    use std::ops::Range;
    pub const ID: Range<usize> = 0..4;
    pub const STATUS: Range<usize> = 4..8;
    pub const TIMEOUT_MS: Range<usize> = 8..12;
    pub const RETRIES: Range<usize> = 12..16;
    pub const LENGTH: Range<usize> = 16..20;
    pub const QPN: Range<usize> = 20..24;
    pub const QKEY: Range<usize> = 24..28;
    pub const LID: Range<usize> = 28..30;
    pub const SL: usize = 30;
    pub const PATH_BITS: usize = 31;
    pub const GRH_PRESENT: usize = 32;
    pub const GID_INDEX: usize = 33;
    pub const HOP_LIMIT: usize = 34;
    pub const TRAFFIC_CLASS: usize = 35;
    pub const GID: Range<usize> = 36..52;
    pub const FLOW_LABEL: Range<usize> = 52..56;
    pub const PKEY_INDEX: Range<usize> = 56..58;

    // struct ib_user_mad_reg_req2
    pub const REG_ID: Range<usize> = 0..4;
    pub const REG_QPN: Range<usize> = 4..8;
    pub const REG_CLASS: usize = 8;
    pub const REG_VERSION: usize = 9;
    pub const REG_FLAGS: Range<usize> = 12..16;
    pub const REG_METHODS: Range<usize> = 16..32;
    pub const REG_OUI: Range<usize> = 32..36;
    pub const REG_RMPP: usize = 36;
}

fn ne32(b: &[u8]) -> u32 {
    u32::from_ne_bytes(b.try_into().unwrap_or_default())
}

/// A user MAD header, validated: where a MAD goes (a write) or came from
/// (a read), and for a request of ours how long the kernel waits for its
/// response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UmadHeader {
    /// The agent that sends it, or that it was received for.
    pub agent: u32,
    /// On a read: 0, or an errno for a send of ours that got no response
    /// (`ETIMEDOUT`).
    pub status: u32,
    /// On a write of a request: how long the kernel keeps it waiting for
    /// its response (responses arriving later are dropped).
    pub timeout_ms: u32,
    /// On a write of a request: how many times the kernel sends it again.
    pub retries: u32,
    /// On a read: the MAD's length (more than a read could take: the read
    /// failed with `ENOSPC`).
    pub length: u32,
    /// The peer's QP (1 for GMPs).
    pub qpn: u32,
    /// The peer QP's Q_Key.
    pub qkey: u32,
    /// The peer's LID (0 on RoCE).
    pub lid: u16,
    /// Service level.
    pub sl: u8,
    /// A GRH with `gid`: required on RoCE.
    pub grh: Option<Grh>,
    /// The P_Key index it goes with (or came with).
    pub pkey_index: u16,
}

/// The GRH fields of a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grh {
    /// The peer's GID.
    pub gid: Gid,
    /// Our GID's index in the device's table.
    pub gid_index: u8,
    /// Hop limit (on RoCEv2, the IP TTL).
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
}

impl UmadHeader {
    /// Reads a header off the front of `b`; `None` when `b` is shorter.
    pub(crate) fn parse(b: &[u8]) -> Option<UmadHeader> {
        let b = b.get(..HDR_LEN)?;
        let grh = (b[field::GRH_PRESENT] != 0).then(|| Grh {
            gid: Gid(b[field::GID].try_into().unwrap_or_default()),
            gid_index: b[field::GID_INDEX],
            hop_limit: b[field::HOP_LIMIT],
            traffic_class: b[field::TRAFFIC_CLASS],
            flow_label: u32::from_be_bytes(b[field::FLOW_LABEL].try_into().unwrap_or_default())
                & 0xf_ffff,
        });
        Some(UmadHeader {
            agent: ne32(&b[field::ID]),
            status: ne32(&b[field::STATUS]),
            timeout_ms: ne32(&b[field::TIMEOUT_MS]),
            retries: ne32(&b[field::RETRIES]),
            length: ne32(&b[field::LENGTH]),
            qpn: u32::from_be_bytes(b[field::QPN].try_into().unwrap_or_default()),
            qkey: u32::from_be_bytes(b[field::QKEY].try_into().unwrap_or_default()),
            lid: u16::from_be_bytes(b[field::LID].try_into().unwrap_or_default()),
            sl: b[field::SL],
            grh,
            pkey_index: u16::from_ne_bytes(b[field::PKEY_INDEX].try_into().unwrap_or_default()),
        })
    }

    /// Writes the header into the first [`HDR_LEN`] bytes of `b` (the
    /// reserved bytes zeroed).
    ///
    /// # Panics
    /// `b` is shorter than [`HDR_LEN`].
    pub(crate) fn emit(&self, b: &mut [u8]) {
        let b = &mut b[..HDR_LEN];
        b.fill(0);
        b[field::ID].copy_from_slice(&self.agent.to_ne_bytes());
        b[field::STATUS].copy_from_slice(&self.status.to_ne_bytes());
        b[field::TIMEOUT_MS].copy_from_slice(&self.timeout_ms.to_ne_bytes());
        b[field::RETRIES].copy_from_slice(&self.retries.to_ne_bytes());
        b[field::LENGTH].copy_from_slice(&self.length.to_ne_bytes());
        b[field::QPN].copy_from_slice(&self.qpn.to_be_bytes());
        b[field::QKEY].copy_from_slice(&self.qkey.to_be_bytes());
        b[field::LID].copy_from_slice(&self.lid.to_be_bytes());
        b[field::SL] = self.sl;
        b[field::PATH_BITS] = 0;
        if let Some(g) = &self.grh {
            b[field::GRH_PRESENT] = 1;
            b[field::GID_INDEX] = g.gid_index;
            b[field::HOP_LIMIT] = g.hop_limit;
            b[field::TRAFFIC_CLASS] = g.traffic_class;
            b[field::GID].copy_from_slice(&g.gid.0);
            b[field::FLOW_LABEL].copy_from_slice(&(g.flow_label & 0xf_ffff).to_be_bytes());
        }
        b[field::PKEY_INDEX].copy_from_slice(&self.pkey_index.to_ne_bytes());
    }
}

/// An agent registration (`struct ib_user_mad_reg_req2`) on QP1 for
/// `class`/`version`, serving `methods` (none: a client, which only sends
/// requests and gets their responses). No OUI, no kernel RMPP: the
/// access layer does RMPP itself.
pub(crate) fn reg_request(class: u8, version: u8, methods: &[u8]) -> [u8; REG_LEN] {
    let mut b = [0u8; REG_LEN];
    b[field::REG_ID].copy_from_slice(&0u32.to_ne_bytes());
    b[field::REG_QPN].copy_from_slice(&1u32.to_ne_bytes());
    b[field::REG_CLASS] = class;
    b[field::REG_VERSION] = version;
    b[field::REG_FLAGS].copy_from_slice(&0u32.to_ne_bytes());
    // The kernel reads the mask as a bitmap of longs: bit m of word m/64.
    let mut mask = [0u64; 2];
    for &m in methods {
        let m = usize::from(m & 0x7f);
        mask[m / 64] |= 1 << (m % 64);
    }
    b[field::REG_METHODS][..8].copy_from_slice(&mask[0].to_ne_bytes());
    b[field::REG_METHODS][8..].copy_from_slice(&mask[1].to_ne_bytes());
    b[field::REG_OUI].copy_from_slice(&0u32.to_ne_bytes());
    b[field::REG_RMPP] = 0;
    b
}

/// The agent ID the kernel wrote back into a registration request.
pub(crate) fn reg_agent_id(b: &[u8; REG_LEN]) -> u32 {
    ne32(&b[field::REG_ID])
}

/// The umad device (`umadN`) of port `port` of device `ibdev`, as the
/// directories under `root` (normally [`SYSFS_UMAD`]) list them.
pub(crate) fn find_umad(root: &Path, ibdev: &str, port: u8) -> Result<String, UmadError> {
    let entries = std::fs::read_dir(root).map_err(|_| UmadError::NoModule)?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("umad"))
        .collect();
    names.sort();
    for n in names {
        let read = |f: &str| std::fs::read_to_string(root.join(&n).join(f)).unwrap_or_default();
        if read("ibdev").trim() == ibdev && read("port").trim().parse() == Ok(port) {
            return Ok(n);
        }
    }
    Err(UmadError::NoPort {
        device: ibdev.into(),
        port,
    })
}

/// Why MADs cannot flow through the kernel on a port; each says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UmadError {
    /// No umad devices at all: the module is not loaded.
    #[error(
        "no user MAD devices ({SYSFS_UMAD} is missing): load the kernel's user MAD \
         interface (modprobe ib_umad)"
    )]
    NoModule,
    /// The module is there but lists no device for this port.
    #[error(
        "no user MAD device for {device} port {port} in {SYSFS_UMAD}: is ib_umad loaded \
         after the device came (modprobe -r ib_umad; modprobe ib_umad)?"
    )]
    NoPort {
        /// The RDMA device.
        device: String,
        /// Its port.
        port: u8,
    },
    /// The device file is missing (no devtmpfs or udev made it).
    #[error(
        "{path} does not exist although sysfs lists it: mount devtmpfs on /dev or let udev \
         create it"
    )]
    NoNode {
        /// The device file.
        path: String,
    },
    /// The device file is not ours to open.
    #[error(
        "cannot open {path}: permission denied: run as root, or give your user access \
         (rdma-core's udev rules: the rdma group, or chmod 0666 {path})"
    )]
    Permission {
        /// The device file.
        path: String,
    },
    /// Another failure opening it or registering an agent.
    #[error("{what} on {path}: {reason}")]
    Io {
        /// What failed.
        what: &'static str,
        /// The device file.
        path: String,
        /// The errno in words.
        reason: String,
    },
}

impl UmadError {
    /// The error of opening `path`, which failed with `e`.
    pub(crate) fn of_open(path: &str, e: &std::io::Error) -> UmadError {
        match e.kind() {
            std::io::ErrorKind::NotFound => UmadError::NoNode { path: path.into() },
            std::io::ErrorKind::PermissionDenied => UmadError::Permission { path: path.into() },
            _ => UmadError::Io {
                what: "open",
                path: path.into(),
                reason: e.to_string(),
            },
        }
    }
}

/// Transaction IDs of our requests. The kernel refuses a request whose
/// ID is still waiting for its response, and puts its agent's number in
/// the upper 32 bits of each request it sends (ib_umad); the access
/// layer resends under the same ID and routes responses by its whole ID.
/// So each send goes out with lower 32 bits of its own, and a response's
/// lower half finds the access layer's ID again. Holds the last
/// [`TidMap::CAP`] sends.
#[derive(Default)]
pub(crate) struct TidMap {
    next: u32,
    ours: std::collections::HashMap<u32, u64>,
    order: std::collections::VecDeque<u32>,
}

impl TidMap {
    /// Sends remembered.
    pub(crate) const CAP: usize = 1024;

    /// A request with the access layer's `tid` goes out: the ID to send
    /// it with.
    pub(crate) fn sent(&mut self, tid: u64) -> u64 {
        self.next = self.next.wrapping_add(1);
        let low = self.next;
        if self.ours.insert(low, tid).is_none() {
            self.order.push_back(low);
        }
        while self.order.len() > Self::CAP {
            if let Some(old) = self.order.pop_front() {
                self.ours.remove(&old);
            }
        }
        (tid & !0xffff_ffff) | u64::from(low)
    }

    /// The access layer's ID of a response that came with `tid` (its own
    /// when it answers nothing we sent lately).
    pub(crate) fn restore(&self, tid: u64) -> u64 {
        self.ours.get(&(tid as u32)).copied().unwrap_or(tid)
    }
}

/// The IPv6 link-local GID of the neighbour at `ip`, from the kernel's
/// ARP table (`/proc/net/arp`, given as `arp`): `fe80::` and the modified
/// EUI-64 of its MAC, the GID a RoCE port's table holds for its
/// interface's link-local address (RFC 4291 2.5.1, as Linux forms it
/// unless told otherwise). `None` without a complete entry.
///
/// Why: the kernel's MAD layer matches a response to its request by
/// comparing the request's source GID with the response's GRH, and a
/// RoCEv2 packet over IPv4 has no GRH (the receive holds an IPv4
/// header), so responses to requests sent by IPv4 are dropped; over
/// IPv6 the header is a GRH and they match.
pub(crate) fn neighbour_link_local(arp: &str, ip: std::net::Ipv4Addr) -> Option<Gid> {
    let ip = ip.to_string();
    arp.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // IP address, HW type, Flags, HW address, Mask, Device.
        if f.len() < 4 || f[0] != ip || f[2] == "0x0" {
            return None;
        }
        let mac: Vec<u8> = f[3]
            .split(':')
            .map(|b| u8::from_str_radix(b, 16))
            .collect::<Result<_, _>>()
            .ok()?;
        if mac.len() != 6 || mac.iter().all(|&b| b == 0) {
            return None;
        }
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[8] = mac[0] ^ 0x02;
        g[9] = mac[1];
        g[10] = mac[2];
        g[11] = 0xff;
        g[12] = 0xfe;
        g[13] = mac[3];
        g[14] = mac[4];
        g[15] = mac[5];
        Some(Gid(g))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header as the kernel writes one for a DM Get received over RoCEv2
    /// from 10.77.0.12 (agent 3, P_Key index 0), byte by byte.
    #[test]
    fn a_received_header_parses_field_by_field() {
        let mut b = [0u8; HDR_LEN];
        b[0..4].copy_from_slice(&3u32.to_ne_bytes()); // id: agent 3
        b[16..20].copy_from_slice(&256u32.to_ne_bytes()); // length
        b[20..24].copy_from_slice(&[0, 0, 0, 1]); // qpn 1, big-endian
        b[24..28].copy_from_slice(&[0x80, 0x01, 0, 0]); // qkey 0x80010000
        b[28..30].copy_from_slice(&[0, 0]); // lid 0 (RoCE)
        b[32] = 1; // grh_present
        b[33] = 1; // gid_index
        b[34] = 64; // hop_limit
        b[36..52].copy_from_slice(&Gid::from_ip([10, 77, 0, 12].into()).0);
        b[52..56].copy_from_slice(&[0xff, 0x01, 0x23, 0x45]); // flow label, 20 bits kept
        let h = UmadHeader::parse(&b).unwrap();
        assert_eq!(
            (h.agent, h.status, h.length, h.qpn, h.qkey, h.lid),
            (3, 0, 256, 1, 0x8001_0000, 0)
        );
        let g = h.grh.unwrap();
        assert_eq!(g.gid, Gid::from_ip([10, 77, 0, 12].into()));
        assert_eq!((g.gid_index, g.hop_limit, g.flow_label), (1, 64, 0x1_2345));
        assert_eq!(h.pkey_index, 0);
        assert_eq!(UmadHeader::parse(&b[..63]), None, "short");
        // Re-emitted, the same bytes but for the flow label's top bits.
        let mut out = [0xaau8; HDR_LEN];
        h.emit(&mut out);
        b[52] = 0x00;
        b[53] = 0x01;
        assert_eq!(out, b);
    }

    #[test]
    fn a_send_header_has_big_endian_address_fields_and_no_grh_unless_asked() {
        let h = UmadHeader {
            agent: 7,
            status: 0,
            timeout_ms: 1000,
            retries: 0,
            length: 0,
            qpn: 1,
            qkey: 0x8001_0000,
            lid: 0x1234,
            sl: 2,
            grh: None,
            pkey_index: 5,
        };
        let mut b = [0xffu8; HDR_LEN];
        h.emit(&mut b);
        assert_eq!(&b[8..12], &1000u32.to_ne_bytes());
        assert_eq!(&b[20..24], &[0, 0, 0, 1]);
        assert_eq!(&b[28..30], &[0x12, 0x34]);
        assert_eq!((b[30], b[32]), (2, 0));
        assert_eq!(&b[56..58], &5u16.to_ne_bytes());
        assert!(b[58..].iter().all(|&x| x == 0), "reserved bytes zeroed");
        assert_eq!(UmadHeader::parse(&b), Some(h));
    }

    #[test]
    fn a_registration_names_qp1_the_class_and_the_methods_as_a_bitmap() {
        // DevMgt (0x06) version 1 serving Get (0x01) and Set (0x02).
        let b = reg_request(0x06, 1, &[0x01, 0x02]);
        assert_eq!(&b[4..8], &1u32.to_ne_bytes(), "QP1");
        assert_eq!((b[8], b[9]), (0x06, 1));
        assert_eq!(&b[16..24], &0b110u64.to_ne_bytes());
        assert_eq!(&b[24..32], &0u64.to_ne_bytes());
        assert_eq!(b[36], 0, "no kernel RMPP");
        // A method above 63 lands in the second word; a client has none.
        let b = reg_request(0x03, 2, &[0x41]);
        assert_eq!(&b[24..32], &2u64.to_ne_bytes());
        let client = reg_request(0x03, 2, &[]);
        assert!(client[16..32].iter().all(|&x| x == 0));
        let mut answered = client;
        answered[0..4].copy_from_slice(&9u32.to_ne_bytes());
        assert_eq!(reg_agent_id(&answered), 9);
    }

    #[test]
    fn the_umad_device_of_a_port_is_found_in_sysfs() {
        let root = std::env::temp_dir().join(format!("umad-sysfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (n, dev, port) in [("umad0", "mlx5_0", 1), ("umad1", "rxe0", 1)] {
            let d = root.join(n);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("ibdev"), format!("{dev}\n")).unwrap();
            std::fs::write(d.join("port"), format!("{port}\n")).unwrap();
        }
        assert_eq!(find_umad(&root, "rxe0", 1), Ok("umad1".into()));
        let e = find_umad(&root, "rxe0", 2).unwrap_err();
        assert_eq!(
            e,
            UmadError::NoPort {
                device: "rxe0".into(),
                port: 2
            }
        );
        assert!(e.to_string().contains("modprobe ib_umad"), "{e}");
        std::fs::remove_dir_all(&root).unwrap();
        let e = find_umad(&root, "rxe0", 1).unwrap_err();
        assert_eq!(e, UmadError::NoModule);
        assert_eq!(
            e.to_string(),
            "no user MAD devices (/sys/class/infiniband_mad is missing): load the kernel's \
             user MAD interface (modprobe ib_umad)"
        );
    }

    #[test]
    fn open_errors_say_what_to_do_in_one_line() {
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let e = UmadError::of_open("/dev/infiniband/umad0", &denied);
        let m = e.to_string();
        assert!(
            m.starts_with("cannot open /dev/infiniband/umad0: permission denied"),
            "{m}"
        );
        assert!(m.contains("run as root"), "{m}");
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        let m = UmadError::of_open("/dev/infiniband/umad0", &missing).to_string();
        assert!(m.contains("devtmpfs"), "{m}");
        for m in [
            UmadError::NoModule.to_string(),
            UmadError::of_open("/x", &denied).to_string(),
        ] {
            assert!(!m.contains('\n'), "{m}");
        }
    }

    /// A /proc/net/arp as a Debian guest shows it: the complete entry
    /// gives the link-local GID rxe lists for that interface; an
    /// incomplete one (flags 0x0) and an unknown address give none.
    #[test]
    fn a_neighbours_link_local_gid_comes_from_its_mac() {
        let arp =
            "IP address       HW type     Flags       HW address            Mask     Device\n\
                   10.77.0.11       0x1         0x2         52:54:00:77:00:0b     *        eth0\n\
                   10.77.0.13       0x1         0x0         00:00:00:00:00:00     *        eth0\n";
        let g = neighbour_link_local(arp, [10, 77, 0, 11].into()).unwrap();
        assert_eq!(g, Gid::from_ip("fe80::5054:ff:fe77:b".parse().unwrap()));
        assert_eq!(neighbour_link_local(arp, [10, 77, 0, 13].into()), None);
        assert_eq!(neighbour_link_local(arp, [10, 77, 0, 14].into()), None);
        assert_eq!(neighbour_link_local("", [10, 77, 0, 11].into()), None);
    }

    #[test]
    fn each_send_gets_an_id_of_its_own_and_the_response_gets_ours_back() {
        let mut t = TidMap::default();
        let ours = 0x0000_0042_0000_0007;
        let first = t.sent(ours);
        let again = t.sent(ours);
        assert_ne!(first as u32, again as u32, "a resend is not a duplicate");
        // The kernel's agent 0x1b in the upper half on the way back.
        let back = |w: u64| (0x1b << 32) | (w & 0xffff_ffff);
        assert_eq!(t.restore(back(first)), ours);
        assert_eq!(t.restore(back(again)), ours);
        // Unknown: untouched.
        assert_eq!(t.restore(0x1b_0000_9999), 0x1b_0000_9999);
        // Bounded: the oldest go.
        for i in 0..TidMap::CAP as u64 {
            t.sent((5 << 32) | i);
        }
        assert_eq!(t.restore(back(first)), back(first));
        assert_eq!(t.ours.len(), TidMap::CAP);
    }
}
