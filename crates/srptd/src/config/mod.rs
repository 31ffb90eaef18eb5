//! `srptd`'s configuration file: what `scst.conf` says for ib_srpt, in TOML.
//!
//! ```toml
//! [target]
//! ip = "127.0.0.1"          # address of the soft RoCE NIC
//! rdma_cm_port = 5555       # ib_srpt's rdma_cm_port
//! fabric = "roce"           # or "ib": a subnet manager (ibsm run) runs the port
//! sm_wait_ms = 30000        # ib: how long to wait at start for the port to go ACTIVE
//! enabled = true
//! rel_tgt_id = 1
//! mtu = 4096                # path MTU; 1024 on a 1500-byte Ethernet link
//! pkey = "all"              # partitions served: "all" of the port's P_Key table,
//!                           # or one P_Key (0x8010) or a list ([0x8010, 0xffff])
//! iwarp = false             # true: srptd's own soft iWARP NIC at ip (RDMA over
//!                           # TCP, Linux siw's peer) instead of soft RoCE; RDMA
//!                           # CM logins only, with the same login strings
//!
//! [[device]]
//! name = "disk0"
//! handler = "vdisk_fileio"  # vdisk_fileio | vdisk_blockio | vdisk_nullio | ram
//!                           # | pass-through (an sg or bsg node) | vcdrom (an ISO image)
//! filename = "/var/lib/srptd/disk0.img"
//! write_through = false     # fileio: durable before completion
//! o_direct = false          # fileio: bypass the page cache
//! rotational = false        # report a rotating medium (VPD B1h)
//! removable = false         # report a removable medium (INQUIRY RMB)
//! nv_cache = false          # the store's cache survives power loss: no flushes
//! threads_num = 4           # threads of its own for its I/O (0: the port's workers)
//! threads_pool_type = "per_initiator"  # each session its own threads | "shared" by all
//!
//! [[lun]]                   # the default LUNs (SCST's target LUNs)
//! lun = 0
//! device = "disk0"
//!
//! [[group]]                 # LUN masking: these initiators see these LUNs
//! name = "db-hosts"
//! initiators = ["0x0000000000000000000000000000aa01", "0x00000000000000000002c903*"]
//! lun = [{ lun = 0, device = "disk1" }]
//! ```
//!
//! Several target ports are `[[target]]` tables instead of one `[target]`,
//! each on its own address (its own GID, hence its own target name) with
//! its own `rdma_cm_port`, `enabled`, `rel_tgt_id`, `pkey` and SRP
//! parameters. They are ports of one SCSI target, as SCST's targets on
//! several HCA ports are: the devices, default LUNs and groups are shared
//! (a `[[target]]` may have default LUNs of its own, its `lun` list),
//! and `rel_tgt_id` tells the ports apart (VPD 83h, persistent
//! reservations), so no two may have the same. `control_socket` and
//! `metrics` belong to the daemon and are read from the first target.
//!
//! ```toml
//! [[target]]
//! ip = "127.0.0.1"
//! rel_tgt_id = 1
//!
//! [[target]]
//! ip = "127.0.0.2"
//! rel_tgt_id = 2
//! pkey = 0x8010
//! ```
//!
//! ALUA (SPC-4 5.16; SCST's device and target groups): `[[target_group]]`
//! tables put target ports, named by `rel_tgt_id`, in groups with an
//! asymmetric access state. With any group, every `[[target]]` must be in
//! one; an ID no `[[target]]` has is a port of another host serving the
//! same LUs (SCST's remote target: same `usn`, a replicated disk), reported
//! to initiators but served there. `srptadm set-group-state` changes a
//! state at run time; so does a reload.
//!
//! ```toml
//! [alua]
//! explicit = false               # accept SET TARGET PORT GROUPS from initiators
//! implicit_transition_time = 10  # seconds, REPORT TARGET PORT GROUPS' extended header
//!
//! [[target_group]]               # SCST's TARGET_GROUP
//! name = "local"
//! group_id = 1
//! state = "active"               # active | nonoptimized | standby | unavailable | transitioning
//! preferred = true
//! targets = [1]                  # rel_tgt_id of each port in the group
//!
//! [[target_group]]
//! name = "peer"
//! group_id = 2
//! state = "standby"
//! targets = [2]
//! ```
//!
//! A LUN on a DRBD device (issue 30; seed 003's High availability) is
//! opened only while this host is DRBD Primary for it: DRBD refuses to
//! open a Secondary's device at all. `drbd_minor` on the `[[device]]` says
//! whose role it follows, and a `[[target_group]]` with `follow` takes its
//! state from that role: `active` while Primary, `standby` while Secondary
//! (SPC-4 5.16.2.4.4: a standby port can become active when asked; an
//! initiator keeps the path and READ CAPACITY still answers), and
//! `transitioning` while the device is being closed. A group of only
//! another host's ports (its peer's) takes the opposite state, since DRBD
//! has one Primary. srptd reads the roles from `[drbd]`'s `status_file`
//! (DRBD 8.4's `/proc/drbd`, its `ro:` field) every `poll_interval_ms`
//! and follows each change it sees; `srptadm set-role DEVICE primary` or
//! `secondary` (the OCF agent's promote and demote) tells it too, and
//! `secondary` returns once in-flight commands finished and the device is
//! closed, so `drbdadm secondary` can follow.
//!
//! ```toml
//! [drbd]
//! status_file = "/proc/drbd"    # where roles are read (DRBD 8.4's format)
//! poll_interval_ms = 500        # 0: never polled; only srptadm set-role
//! drain_ms = "30s"              # demotion: how long in-flight commands may take
//!
//! [[device]]
//! name = "r0"
//! handler = "vdisk_blockio"
//! filename = "/dev/drbd0"
//! usn = "r0"                    # the same on both hosts: one LU to initiators
//! drbd_minor = 0                # opened only while this host is Primary for minor 0
//!
//! [[target_group]]
//! name = "here"
//! group_id = 1
//! targets = [1]
//! follow = "r0"                 # active while Primary for r0, standby while Secondary
//!
//! [[target_group]]
//! name = "peer"
//! group_id = 2
//! targets = [2]                 # the other host's port
//! follow = "r0"                 # the opposite
//! ```
//!
//! Sizes (`size`, `block_size`, `srp_max_*_size`) are bytes, as a number
//! or a string with K, M, G or T (`"64K"`, powers of 1024); durations
//! (`*_ms`) are milliseconds, as a number or a string with a unit
//! (`"30s"`, `"500ms"`, `"2m"`): the forms of every command line
//! (`rdma_types::units`).
//!
//! Initiator names are session names as `srptadm list sessions` shows them:
//! `0x` and the 16-byte initiator port identifier; a trailing `*` matches
//! by prefix. Every error names the file, the line and the key.

use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use toml::Spanned;

/// The whole file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The target ports: `[target]` (one) or `[[target]]` (several);
    /// never empty once validated.
    #[serde(
        rename = "target",
        default = "one_default_target",
        deserialize_with = "one_or_many",
        serialize_with = "write_one_or_many"
    )]
    pub targets: Vec<TargetSection>,
    #[serde(default, rename = "device", skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceSection>,
    #[serde(default, rename = "lun", skip_serializing_if = "Vec::is_empty")]
    pub luns: Vec<LunEntry>,
    #[serde(default, rename = "group", skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupSection>,
    /// ALUA settings of the whole target (`[alua]`).
    #[serde(default, skip_serializing_if = "AluaSection::is_default")]
    pub alua: AluaSection,
    /// Target port groups (`[[target_group]]`); none: no ALUA.
    #[serde(
        default,
        rename = "target_group",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub target_groups: Vec<TargetGroupSection>,
    /// Where DRBD roles come from (`[drbd]`), for devices with
    /// `drbd_minor`.
    #[serde(default, skip_serializing_if = "DrbdSection::is_default")]
    pub drbd: DrbdSection,
    /// The file it was read from, so that a problem found after parsing
    /// (opening a device at `--check` or start) names its line.
    #[serde(skip)]
    origin: Origin,
}

/// Where a configuration was read from: the file and where its lines
/// start. A value given on the command line has no place in it.
#[derive(Debug, Clone, Default)]
struct Origin {
    file: PathBuf,
    line_starts: std::sync::Arc<Vec<usize>>,
}

impl Origin {
    fn new(text: &str, file: &Path) -> Origin {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Origin {
            file: file.into(),
            line_starts: std::sync::Arc::new(starts),
        }
    }

    /// The 1-based line of a span, 0 for a value the file does not hold
    /// (a default or a command line option: an empty span at 0).
    fn line_of(&self, span: &std::ops::Range<usize>) -> usize {
        if span.is_empty() && span.start == 0 {
            return 0;
        }
        self.line_starts.partition_point(|s| *s <= span.start)
    }

    /// The error of the value at `span`, at `key`.
    fn error(&self, span: std::ops::Range<usize>, key: String, message: String) -> ConfigError {
        ConfigError {
            file: self.file.clone(),
            line: self.line_of(&span),
            key,
            message,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            targets: one_default_target(),
            devices: Vec::new(),
            luns: Vec::new(),
            groups: Vec::new(),
            alua: AluaSection::default(),
            target_groups: Vec::new(),
            drbd: DrbdSection::default(),
            origin: Origin::default(),
        }
    }
}

fn one_default_target() -> Vec<TargetSection> {
    vec![TargetSection::default()]
}

/// `[target]` is one target, `[[target]]` a list of them. The tables go
/// to `TargetSection`'s own deserializer (not through an untagged enum),
/// so its spans, defaults and unknown-key errors stay those of the file.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<TargetSection>, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Vec<TargetSection>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a [target] table or [[target]] tables")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, m: A) -> Result<Self::Value, A::Error> {
            TargetSection::deserialize(serde::de::value::MapAccessDeserializer::new(m))
                .map(|t| vec![t])
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, s: A) -> Result<Self::Value, A::Error> {
            Vec::<TargetSection>::deserialize(serde::de::value::SeqAccessDeserializer::new(s))
        }
    }
    d.deserialize_any(V)
}

/// One target is written as `[target]`, as files before `[[target]]` had it.
fn write_one_or_many<S: serde::Serializer>(t: &[TargetSection], s: S) -> Result<S::Ok, S::Error> {
    match t {
        [one] => one.serialize(s),
        many => many.serialize(s),
    }
}

/// `[target]`: an SRP target port and the daemon around it. The SRP
/// parameters carry ib_srpt's names and defaults (SCST srpt README).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TargetSection {
    /// An rdma-core device (`rxe0`, `mlx5_0:1`: name and port, port 1 by
    /// default) the port runs on: a real RDMA NIC or Linux rxe/siw, its
    /// logins through the kernel's RDMA CM on the device's addresses.
    /// Unset: the port is srptd's own soft RoCE NIC at `ip`/`udp_port`.
    pub device: Option<Spanned<String>>,
    /// Run the port on srptd's own soft iWARP NIC at `ip` (RDMA over
    /// TCP: MPA, DDP and RDMAP, what Linux siw speaks) instead of soft
    /// RoCE: logins by RDMA CM, which on iWARP is a TCP connection to
    /// `rdma_cm_port` and the MPA exchange. iWARP has no QP1, so no IB CM
    /// logins and no DM agent for discovery; not with `device` or
    /// `fabric = "ib"`.
    #[serde(skip_serializing_if = "is_false")]
    pub iwarp: Spanned<bool>,
    pub ip: Spanned<IpAddr>,
    pub udp_port: Spanned<u16>,
    /// Who runs the port: `roce` (no SM) or `ib` (`ibsm run` configures
    /// it; see `rdma_access::subnet`).
    pub fabric: rdma_access::subnet::Fabric,
    /// In the `ib` fabric, how long to wait at start for the SM to make the
    /// port ACTIVE.
    #[serde(deserialize_with = "de_sm_wait_ms")]
    pub sm_wait_ms: Spanned<u64>,
    /// ib_srpt's `rdma_cm_port`: the port RDMA CM logins (Linux ib_srp
    /// `dest=ip:port`) arrive on; 0 turns RDMA CM off, as in SCST. Our
    /// default is 5555, not SCST's 0: on a RoCE port RDMA CM is how Linux
    /// initiators log in.
    pub rdma_cm_port: u16,
    /// Also take logins by IB CM on the service ID = ioc_guid (ib_srpt).
    pub ib_cm: bool,
    pub enabled: bool,
    pub rel_tgt_id: Spanned<u16>,
    /// The partitions the target serves (ib_srpt serves every P_Key of
    /// its port's table): `"all"` (the default), one P_Key or a list. A
    /// login gets a QP with the index of the port's P_Key table entry
    /// matching its CM REQ's partition key; a login in a partition not
    /// listed is refused.
    pub pkey: Spanned<PkeySetting>,
    /// Largest IU an initiator may send (login, SRP_CMD with its
    /// descriptors or immediate data). 8260, not SCST's 4148: Linux
    /// ib_srp asks for 68 + 8 KiB of immediate data, which 4148 refuses.
    #[serde(deserialize_with = "de_srp_max_req_size")]
    pub srp_max_req_size: Spanned<u32>,
    /// Largest IU the target sends (SRP_RSP with sense): 256, as SCST.
    #[serde(deserialize_with = "de_srp_max_rsp_size")]
    pub srp_max_rsp_size: Spanned<u32>,
    /// The port's path MTU in bytes: 4096 (loopback, jumbo frames), 1024
    /// on a 1500-byte Ethernet link, as rxe reports it. Logins use the
    /// smaller of this and the initiator's.
    #[serde(deserialize_with = "de_mtu")]
    pub mtu: Spanned<u32>,
    /// Most bytes one RDMA READ or WRITE moves: 65536, as SCST.
    #[serde(deserialize_with = "de_srp_max_rdma_size")]
    pub srp_max_rdma_size: Spanned<u32>,
    /// Receive buffers of the one shared receive queue: 4095, as SCST.
    /// The target always uses an SRQ (Linux's in-tree ib_srpt has a
    /// `use_srq` switch, off there; SCST's has none).
    pub srpt_srq_size: Spanned<u32>,
    /// Send queue entries per channel. 4096, as Linux's in-tree ib_srpt,
    /// not SCST's 256: a channel with many large commands in flight posts
    /// one RDMA WRITE per `srp_max_rdma_size` bytes, and a full send
    /// queue makes the rest wait inside the target.
    pub srpt_sq_size: Spanned<u32>,
    /// Most channels of the target port, all initiators together (SCST
    /// has no such limit; each channel costs its QP, CQ and send slots).
    pub max_channels: Spanned<u32>,
    /// Milliseconds an accepted login may wait for the CM's RTU before
    /// its channel is closed (an initiator that refused the login
    /// response or died after it).
    #[serde(deserialize_with = "de_login_timeout_ms")]
    pub login_timeout_ms: Spanned<u64>,
    /// Most logins of the port not yet established: a new one beyond it
    /// drops the oldest, so half-open logins cannot keep others out.
    pub max_pending_logins: Spanned<u32>,
    /// Most logins of one initiator port not yet established: a new one
    /// beyond it is refused.
    pub max_pending_per_initiator: Spanned<u32>,
    /// Milliseconds a live channel may stay idle before the target checks
    /// its initiator is still there (a zero-length RDMA WRITE its NIC
    /// must acknowledge); a dead initiator's session is freed within
    /// about twice this. 0 turns the check off.
    #[serde(deserialize_with = "de_keepalive_ms")]
    pub keepalive_ms: Spanned<u64>,
    /// Control socket for `srptadm` (mode 0600); the daemon's, so only
    /// the first target's counts.
    pub control_socket: Spanned<PathBuf>,
    /// Prometheus endpoint, off when absent: `"address:port"`, or a bare
    /// port (`9100` or `"9100"`) on the loopback address. The daemon's:
    /// only the first target may set it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Spanned<MetricsAddr>>,
    /// This port's own default LUNs (`lun = [{ lun = 0, device = "d" }]`,
    /// SCST's LUNs of one target): initiators outside every group that
    /// log in through this port see these instead of the file's `[[lun]]`
    /// set. Empty: the file's default LUNs, as every port shares them.
    #[serde(rename = "lun", skip_serializing_if = "Vec::is_empty")]
    pub luns: Vec<LunEntry>,
}

/// Where the metrics endpoint listens (`target.metrics`, `--metrics`): an
/// `address:port`, or a bare port on 127.0.0.1, so turning metrics on
/// never exposes them beyond the host unless an address says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "PortOrAddr", into = "String")]
pub struct MetricsAddr(pub std::net::SocketAddr);

#[derive(Deserialize)]
#[serde(untagged)]
enum PortOrAddr {
    Port(u16),
    Text(String),
}

/// A `metrics` setting that is neither a port nor `address:port`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("metrics: '{0}' is neither a port (served on 127.0.0.1) nor address:port")]
pub struct MetricsAddrError(pub String);

impl TryFrom<PortOrAddr> for MetricsAddr {
    type Error = MetricsAddrError;
    fn try_from(v: PortOrAddr) -> Result<MetricsAddr, MetricsAddrError> {
        match v {
            PortOrAddr::Port(p) => Ok(MetricsAddr((std::net::Ipv4Addr::LOCALHOST, p).into())),
            PortOrAddr::Text(t) => t.parse(),
        }
    }
}

impl std::str::FromStr for MetricsAddr {
    type Err = MetricsAddrError;
    fn from_str(s: &str) -> Result<MetricsAddr, MetricsAddrError> {
        if let Ok(p) = s.parse::<u16>() {
            return Ok(MetricsAddr((std::net::Ipv4Addr::LOCALHOST, p).into()));
        }
        s.parse()
            .map(MetricsAddr)
            .map_err(|_| MetricsAddrError(s.to_string()))
    }
}

impl From<MetricsAddr> for String {
    fn from(m: MetricsAddr) -> String {
        m.0.to_string()
    }
}

/// Why a `target.pkey` setting serves no partition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PkeyError {
    /// `pkey = []`.
    #[error("an empty list serves no partition (use \"all\")")]
    EmptyList,
    /// A word other than `all`.
    #[error("{0:?}: expected \"all\", a P_Key (0x8010) or a list of P_Keys")]
    Word(String),
    /// A P_Key whose partition number is 0 (IBA 10.9.1.2).
    #[error("P_Key {0:#06x} is invalid: its partition number is 0")]
    NoPartition(u16),
}

/// `target.pkey`: `"all"`, one P_Key or a list of them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum PkeySetting {
    /// One partition.
    One(u16),
    /// Several partitions.
    List(Vec<u16>),
    /// `"all"`: every P_Key of the port's table.
    Word(String),
}

impl PkeySetting {
    /// The partitions listed (empty for `"all"`), or why the setting is
    /// not valid.
    ///
    /// # Errors
    /// A word other than `all`, an empty list, or a P_Key without a
    /// partition number (0x0000 and 0x8000 are invalid, IBA 10.9.1.2).
    pub fn pkeys(&self) -> Result<Vec<rdma_types::Pkey>, PkeyError> {
        let list = match self {
            PkeySetting::One(k) => vec![*k],
            PkeySetting::List(l) if l.is_empty() => return Err(PkeyError::EmptyList),
            PkeySetting::List(l) => l.clone(),
            PkeySetting::Word(w) if w == "all" => return Ok(Vec::new()),
            PkeySetting::Word(w) => return Err(PkeyError::Word(w.clone())),
        };
        match list.iter().find(|k| **k & 0x7fff == 0) {
            Some(k) => Err(PkeyError::NoPartition(*k)),
            None => Ok(list.into_iter().map(rdma_types::Pkey).collect()),
        }
    }
}

impl Default for TargetSection {
    fn default() -> Self {
        let s = |v| Spanned::new(0..0, v);
        TargetSection {
            device: None,
            iwarp: Spanned::new(0..0, false),
            ip: Spanned::new(0..0, IpAddr::from([127, 0, 0, 1])),
            udp_port: Spanned::new(0..0, 4791),
            fabric: rdma_access::subnet::Fabric::Roce,
            sm_wait_ms: Spanned::new(0..0, 30_000),
            rdma_cm_port: srp::RDMA_CM_PORT,
            ib_cm: true,
            enabled: true,
            rel_tgt_id: Spanned::new(0..0, 1),
            pkey: Spanned::new(0..0, PkeySetting::Word("all".into())),
            srp_max_req_size: s(8260),
            srp_max_rsp_size: s(256),
            mtu: s(4096),
            srp_max_rdma_size: s(65536),
            srpt_srq_size: s(4095),
            srpt_sq_size: s(4096),
            max_channels: s(1024),
            login_timeout_ms: Spanned::new(0..0, 10_000),
            max_pending_logins: s(64),
            max_pending_per_initiator: s(4),
            keepalive_ms: Spanned::new(0..0, 15_000),
            control_socket: Spanned::new(0..0, default_control_socket()),
            metrics: None,
            luns: Vec::new(),
        }
    }
}

/// A key left out of a written file when off.
fn is_false(b: &Spanned<bool>) -> bool {
    !*b.get_ref()
}

/// `/run/srptd.sock` for root, `$TMPDIR/srptd-<uid>.sock` for others.
pub fn default_control_socket() -> PathBuf {
    daemon_ctl::control_socket_of("srptd")
}

/// Most threads of its own a device may have (`threads_num`).
pub const MAX_DEVICE_THREADS: u32 = 64;

/// The device handlers (SCST's `vdisk_*` names; `pass-through` is SCST's
/// `dev_disk`, whose module is `scst_disk`: both names are taken too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum Handler {
    /// Commands passed to a real SCSI device through its sg node
    /// (`filename = "/dev/sgN"`) or its bsg node (`/dev/bsg/H:C:T:L`;
    /// `scsi::passthrough`).
    #[serde(rename = "pass-through", alias = "dev_disk", alias = "scst_disk")]
    PassThrough,
    #[serde(rename = "vdisk_fileio")]
    FileIo,
    #[serde(rename = "vdisk_blockio")]
    BlockIo,
    #[serde(rename = "vdisk_nullio")]
    NullIo,
    #[serde(rename = "ram")]
    Ram,
    /// A read-only CD-ROM whose disc is an ISO image (`filename`; none or
    /// an empty file: no disc; `scsi::vcdrom`), SCST's `vcdrom`.
    #[serde(rename = "vcdrom")]
    VCdrom,
}

impl Handler {
    pub fn name(self) -> &'static str {
        match self {
            Handler::FileIo => "vdisk_fileio",
            Handler::BlockIo => "vdisk_blockio",
            Handler::NullIo => "vdisk_nullio",
            Handler::Ram => "ram",
            Handler::PassThrough => "pass-through",
            Handler::VCdrom => "vcdrom",
        }
    }
}

/// `[[device]]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceSection {
    pub name: Spanned<String>,
    pub handler: Spanned<Handler>,
    /// File or block device (fileio, blockio); the sg or bsg node of the
    /// device (pass-through, `/dev/sgN` or `/dev/bsg/H:C:T:L`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filename: Option<Spanned<PathBuf>>,
    /// Size in bytes, a number or a string with a K/M/G/T suffix (ram,
    /// nullio; fileio creates a missing file of this size).
    #[serde(
        default,
        deserialize_with = "de_device_size",
        skip_serializing_if = "Option::is_none"
    )]
    pub size: Option<Spanned<String>>,
    /// Written back only when not the default 512 (the pass-through and
    /// vcdrom handlers refuse the key, so a saved file must not name it).
    #[serde(
        default = "default_block_size",
        deserialize_with = "de_block_size",
        skip_serializing_if = "is_default_block_size"
    )]
    pub block_size: Spanned<u32>,
    #[serde(default)]
    pub read_only: bool,
    /// Thin provisioning (UNMAP, WRITE SAME with UNMAP).
    #[serde(default)]
    pub thin: bool,
    /// Report a rotating medium (VPD B1h rate "not reported", which Linux
    /// takes as rotational); off: non-rotating (SCST vdisk `rotational`).
    #[serde(default)]
    pub rotational: bool,
    /// A removable medium (INQUIRY RMB; SCST vdisk `removable`).
    #[serde(default)]
    pub removable: bool,
    /// The store is behind a non-volatile cache (SCST vdisk `nv_cache`):
    /// FUA and SYNCHRONIZE CACHE flush nothing, VPD 86h says NV_SUP.
    #[serde(default)]
    pub nv_cache: bool,
    /// vdisk_fileio: every write is durable before it completes (SCST
    /// `write_through`).
    #[serde(default)]
    pub write_through: bool,
    /// vdisk_fileio: I/O bypasses the page cache (O_DIRECT, aligned to
    /// `block_size`; SCST `o_direct`).
    #[serde(default)]
    pub o_direct: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub t10_vendor_id: Option<Spanned<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub t10_product_id: Option<Spanned<String>>,
    /// Unit serial number (VPD page 80h). When set, the NAA designator
    /// (VPD page 83h, what dm-multipath names a disk by) comes from it
    /// too, so a disk shared by two target hosts is one LU when both give
    /// it the same usn. Unset, both come from this host's machine ID and
    /// the device name: unique per host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usn: Option<Spanned<String>>,
    /// The DRBD minor this device is (`/dev/drbdN`): srptd opens it only
    /// while this host is Primary for that minor, and closes it (after
    /// its in-flight commands) when told or seen to become Secondary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drbd_minor: Option<Spanned<u32>>,
    /// Threads of the device's own for its commands (SCST's
    /// `threads_num`); absent or 0: the port's shared workers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads_num: Option<Spanned<u32>>,
    /// Whose those threads are (SCST's `threads_pool_type`): each
    /// session's own (`per_initiator`, the default) or one pool per
    /// target port for every session (`shared`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads_pool_type: Option<ThreadsPoolType>,
}

/// `threads_pool_type`'s values, SCST's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum ThreadsPoolType {
    #[serde(rename = "per_initiator")]
    PerInitiator,
    #[serde(rename = "shared")]
    Shared,
}

fn default_block_size() -> Spanned<u32> {
    Spanned::new(0..0, 512)
}

fn is_default_block_size(b: &Spanned<u32>) -> bool {
    *b.get_ref() == 512
}

/// One LUN mapping.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LunEntry {
    pub lun: Spanned<u32>,
    pub device: Spanned<String>,
}

/// `[[group]]`: a security group (LUN masking).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GroupSection {
    pub name: Spanned<String>,
    #[serde(default)]
    pub initiators: Vec<Spanned<String>>,
    #[serde(default, rename = "lun")]
    pub luns: Vec<LunEntry>,
}

/// `[alua]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AluaSection {
    /// Initiators may change the groups' states with SET TARGET PORT
    /// GROUPS (INQUIRY TPGS 11b); off, only srptd's configuration and
    /// `srptadm` do (TPGS 01b).
    pub explicit: bool,
    /// IMPLICIT TRANSITION TIME (seconds) that REPORT TARGET PORT GROUPS
    /// tells initiators to allow a transition (0: not said; Linux then
    /// waits 60 s).
    pub implicit_transition_time: u8,
}

impl AluaSection {
    fn is_default(&self) -> bool {
        *self == AluaSection::default()
    }
}

/// `[[target_group]]`: one target port group (SCST's TARGET_GROUP).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TargetGroupSection {
    pub name: Spanned<String>,
    /// TARGET PORT GROUP, 1..=65535 (SCST's `group_id`).
    pub group_id: Spanned<u16>,
    /// `active`, `nonoptimized`, `standby`, `unavailable` or
    /// `transitioning` (SCST's words); absent only with `follow`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<Spanned<String>>,
    /// A `[[device]]` with `drbd_minor` whose DRBD role sets the state:
    /// a group of this host's ports is active while Primary and standby
    /// while Secondary; a group of another host's ports the opposite.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow: Option<Spanned<String>>,
    /// PREF: initiators should prefer this group's ports.
    #[serde(default)]
    pub preferred: bool,
    /// The ports' `rel_tgt_id`s: a `[[target]]`'s, or another host's.
    #[serde(default)]
    pub targets: Vec<Spanned<u16>>,
}

impl TargetGroupSection {
    /// The group's state (checked when the file was read).
    pub fn access_state(&self) -> scsi::AccessState {
        self.state
            .as_ref()
            .and_then(|s| s.get_ref().parse().ok())
            .unwrap_or(scsi::AccessState::Standby)
    }
}

/// `[drbd]`: where srptd reads DRBD roles for the devices with
/// `drbd_minor`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DrbdSection {
    /// DRBD 8.4's status (`/proc/drbd`): a line per minor with its
    /// `ro:` (local/peer role). A missing file: every minor Secondary.
    pub status_file: PathBuf,
    /// How often the roles are read, in milliseconds; 0: never (only
    /// `srptadm set-role` changes them).
    #[serde(deserialize_with = "de_poll_ms")]
    pub poll_interval_ms: Spanned<u64>,
    /// How long a demotion waits for in-flight commands before it gives
    /// up (the device stays closed to new ones), in milliseconds.
    #[serde(deserialize_with = "de_drain_ms")]
    pub drain_ms: Spanned<u64>,
}

impl Default for DrbdSection {
    fn default() -> Self {
        DrbdSection {
            status_file: PathBuf::from("/proc/drbd"),
            poll_interval_ms: Spanned::new(0..0, 500),
            drain_ms: Spanned::new(0..0, 30_000),
        }
    }
}

impl DrbdSection {
    fn is_default(&self) -> bool {
        self.status_file == Path::new("/proc/drbd")
            && *self.poll_interval_ms.get_ref() == 500
            && *self.drain_ms.get_ref() == 30_000
    }
}

fn de_poll_ms<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Spanned<u64>, D::Error> {
    de_millis(d, "poll_interval_ms")
}

fn de_drain_ms<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Spanned<u64>, D::Error> {
    de_millis(d, "drain_ms")
}

impl Config {
    /// The SCSI core's ALUA settings this file describes.
    pub fn alua(&self) -> scsi::Alua {
        scsi::Alua {
            groups: self
                .target_groups
                .iter()
                .map(|g| scsi::PortGroup {
                    id: *g.group_id.get_ref(),
                    state: g.access_state(),
                    preferred: g.preferred,
                    ports: g.targets.iter().map(|t| *t.get_ref()).collect(),
                    status: Default::default(),
                })
                .collect(),
            explicit: self.alua.explicit,
            transition_secs: self.alua.implicit_transition_time,
        }
    }

    /// Checks `[alua]` and `[[target_group]]`.
    fn validate_alua(&self) -> Result<(), (std::ops::Range<usize>, String, String)> {
        let mut names = HashSet::new();
        let mut ids = HashSet::new();
        let mut ports: std::collections::HashMap<u16, String> = Default::default();
        for (i, g) in self.target_groups.iter().enumerate() {
            let at = |k: &str| format!("target_group[{i}].{k}");
            let name = g.name.get_ref();
            if name.is_empty() || !names.insert(name.clone()) {
                return Err((
                    g.name.span(),
                    at("name"),
                    format!("target group name `{name}` is empty or used twice"),
                ));
            }
            let id = *g.group_id.get_ref();
            if id == 0 {
                return Err((
                    g.group_id.span(),
                    at("group_id"),
                    "must be 1..=65535 (as SCST's group_id)".into(),
                ));
            }
            if !ids.insert(id) {
                return Err((
                    g.group_id.span(),
                    at("group_id"),
                    format!("group_id {id} is another target group's too"),
                ));
            }
            match (&g.state, &g.follow) {
                (Some(s), _) => {
                    if let Err(e) = s.get_ref().parse::<scsi::AccessState>() {
                        return Err((s.span(), at("state"), e.to_string()));
                    }
                }
                (None, None) => {
                    return Err((
                        g.name.span(),
                        at("state"),
                        "a target group needs a state (active, nonoptimized, standby, \
                         unavailable, transitioning), or follow = \"DEVICE\" to take it from a \
                         DRBD device's role"
                            .into(),
                    ))
                }
                (None, Some(_)) => {}
            }
            if let Some(f) = &g.follow {
                let dev = self
                    .devices
                    .iter()
                    .find(|d| d.name.get_ref() == f.get_ref());
                match dev {
                    None => {
                        return Err((
                            f.span(),
                            at("follow"),
                            format!("no [[device]] named `{}`", f.get_ref()),
                        ))
                    }
                    Some(d) if d.drbd_minor.is_none() => {
                        return Err((
                            f.span(),
                            at("follow"),
                            format!(
                                "device `{}` has no drbd_minor: a group follows a DRBD \
                                 device's role (add drbd_minor = N to the device)",
                                f.get_ref()
                            ),
                        ))
                    }
                    Some(_) => {}
                }
                let local: Vec<bool> = g
                    .targets
                    .iter()
                    .map(|t| {
                        self.targets
                            .iter()
                            .any(|p| p.rel_tgt_id.get_ref() == t.get_ref())
                    })
                    .collect();
                if local.contains(&true) && local.contains(&false) {
                    return Err((
                        f.span(),
                        at("follow"),
                        "a group that follows a DRBD role holds either this host's ports or \
                         the peer's, not both: split it in two groups"
                            .into(),
                    ));
                }
            }
            if g.targets.is_empty() {
                return Err((
                    g.name.span(),
                    at("targets"),
                    "a target group needs at least one port: targets = [rel_tgt_id, ...]".into(),
                ));
            }
            for (j, t) in g.targets.iter().enumerate() {
                let rel = *t.get_ref();
                if rel == 0 {
                    return Err((
                        t.span(),
                        format!("target_group[{i}].targets[{j}]"),
                        "rel_tgt_id 0 is reserved".into(),
                    ));
                }
                if let Some(other) = ports.insert(rel, name.clone()) {
                    return Err((
                        t.span(),
                        format!("target_group[{i}].targets[{j}]"),
                        format!("rel_tgt_id {rel} is in target group `{other}` too: a port is in one group"),
                    ));
                }
            }
        }
        if self.target_groups.is_empty() {
            if self.alua.explicit {
                return Err((
                    0..0,
                    "alua.explicit".into(),
                    "explicit transitions need target port groups: add [[target_group]] tables"
                        .into(),
                ));
            }
            return Ok(());
        }
        for (i, t) in self.targets.iter().enumerate() {
            let rel = *t.rel_tgt_id.get_ref();
            if !ports.contains_key(&rel) {
                return Err((
                    t.rel_tgt_id.span(),
                    format!("{}.rel_tgt_id", self.target_key(i)),
                    format!(
                        "rel_tgt_id {rel} is in no [[target_group]]: with target groups every \
                         port needs one (add {rel} to a group's targets)"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// A configuration error: where and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based; 0 when the problem has no place in the file.
    pub line: usize,
    /// Dotted key path, e.g. `device[2].handler`.
    pub key: String,
    pub message: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A configuration built in memory has no file.
        if !self.file.as_os_str().is_empty() {
            write!(f, "{}", self.file.display())?;
            if self.line > 0 {
                write!(f, ":{}", self.line)?;
            }
            f.write_str(": ")?;
        }
        if !self.key.is_empty() {
            write!(f, "{}: ", self.key)?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

/// The one size parser of every command line and key
/// (`rdma_types::units`), re-exported for the daemon's requests.
pub use rdma_types::units::{parse_size, SizeError};

/// A size on a command line kept as written (`srptadm add-device --size`,
/// `resize`): checked here, so a typo is refused before the daemon is
/// asked, and read again by the daemon.
///
/// # Errors
/// What [`parse_size`] refuses.
pub fn size_arg(s: &str) -> Result<String, SizeError> {
    parse_size(s).map(|_| s.to_string())
}

/// A key that takes a number or a string in the forms of
/// `rdma_types::units`: `keepalive_ms = 15000` or `"15s"`,
/// `srp_max_rdma_size = 65536` or `"64K"`.
enum Written {
    Number(u64),
    Text(String),
}

impl<'de> Deserialize<'de> for Written {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Written, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Written;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a whole number or a string such as \"64K\" or \"30s\"")
            }
            fn visit_u64<E>(self, n: u64) -> Result<Written, E> {
                Ok(Written::Number(n))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Written, E> {
                u64::try_from(n)
                    .map(Written::Number)
                    .map_err(|_| E::custom(format!("{n} is negative")))
            }
            fn visit_str<E>(self, s: &str) -> Result<Written, E> {
                Ok(Written::Text(s.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// `key`'s value in milliseconds: a number of them, or a duration with
/// its unit (`"30s"`).
fn de_millis<'de, D: serde::Deserializer<'de>>(d: D, key: &str) -> Result<Spanned<u64>, D::Error> {
    use serde::de::Error;
    let v = Spanned::<Written>::deserialize(d)?;
    let span = v.span();
    let ms = match v.into_inner() {
        Written::Number(n) => n,
        Written::Text(t) => rdma_types::units::millis(&t)
            .map(rdma_types::units::as_millis)
            .map_err(|e| D::Error::custom(format!("{key}: {e}")))?,
    };
    Ok(Spanned::new(span, ms))
}

/// `key`'s value in bytes, at most `u32::MAX`: a number, or a size with
/// its unit (`"64K"`).
fn de_bytes_u32<'de, D: serde::Deserializer<'de>>(
    d: D,
    key: &str,
) -> Result<Spanned<u32>, D::Error> {
    use serde::de::Error;
    let v = Spanned::<Written>::deserialize(d)?;
    let span = v.span();
    let n = match v.into_inner() {
        Written::Number(n) => u32::try_from(n)
            .map_err(|_| D::Error::custom(format!("{key}: {n} is more than {} bytes", u32::MAX))),
        Written::Text(t) => {
            rdma_types::units::size::<u32>(&t).map_err(|e| D::Error::custom(format!("{key}: {e}")))
        }
    }?;
    Ok(Spanned::new(span, n))
}

/// The keys read by [`de_millis`] and [`de_bytes_u32`], each naming
/// itself in its errors.
macro_rules! keyed {
    ($($f:ident: $t:ty = $de:ident($key:literal);)*) => {$(
        fn $f<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Spanned<$t>, D::Error> {
            $de(d, $key)
        }
    )*};
}

keyed! {
    de_sm_wait_ms: u64 = de_millis("sm_wait_ms");
    de_login_timeout_ms: u64 = de_millis("login_timeout_ms");
    de_keepalive_ms: u64 = de_millis("keepalive_ms");
    de_srp_max_req_size: u32 = de_bytes_u32("srp_max_req_size");
    de_srp_max_rsp_size: u32 = de_bytes_u32("srp_max_rsp_size");
    de_mtu: u32 = de_bytes_u32("mtu");
    de_srp_max_rdma_size: u32 = de_bytes_u32("srp_max_rdma_size");
    de_block_size: u32 = de_bytes_u32("block_size");
}

/// A device's `size`: a string (`"64M"`, checked by `validate`, which
/// names the key) or a number of bytes, kept as its digits.
fn de_device_size<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Spanned<String>>, D::Error> {
    let v = Spanned::<Written>::deserialize(d)?;
    let span = v.span();
    let text = match v.into_inner() {
        Written::Number(n) => n.to_string(),
        Written::Text(t) => t,
    };
    Ok(Some(Spanned::new(span, text)))
}

/// The dotted key (`device[2].handler`) of the value at byte `at` of a
/// TOML text, read from the text itself: the table headers before it
/// (`[[device]]` counted per name) and the `key =` of its line. Empty
/// when the line has no key (a header, a broken line). For errors the
/// parser reports by place only (a wrong type, an unknown value).
fn key_at(text: &str, at: usize) -> String {
    let mut table = String::new();
    let mut counts: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut start = 0;
    for line in text.split_inclusive('\n') {
        let end = start + line.len();
        let t = line.trim();
        let here = at >= start && (at < end || end == text.len());
        if let Some(name) = t.strip_prefix("[[").and_then(|r| r.split("]]").next()) {
            let name = name.trim().to_string();
            let n = counts.entry(name.clone()).or_insert(0);
            table = format!("{name}[{n}]");
            *n += 1;
        } else if let Some(name) = t.strip_prefix('[').and_then(|r| r.split(']').next()) {
            table = name.trim().to_string();
        } else if here {
            let key = t.split('=').next().unwrap_or("").trim();
            let bare = !key.is_empty()
                && t.contains('=')
                && key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
            return match (bare, table.is_empty()) {
                (false, _) => String::new(),
                (true, true) => key.to_string(),
                (true, false) => format!("{table}.{key}"),
            };
        }
        if here {
            return String::new();
        }
        start = end;
    }
    String::new()
}

impl Config {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.into(),
            line: 0,
            key: String::new(),
            message: format!("cannot read: {e}"),
        })?;
        Config::parse(&text, path)
    }

    /// Parses and validates `text`, naming `path` in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let origin = Origin::new(text, path);
        let mut cfg: Config = toml::from_str(text).map_err(|e| {
            let span = e.span().unwrap_or(0..0);
            let key = key_at(text, span.start);
            origin.error(span, key, e.message().trim().to_string())
        })?;
        cfg.validate()
            .map_err(|(span, key, message)| origin.error(span, key, message))?;
        cfg.origin = origin;
        Ok(cfg)
    }

    /// The error of the value at `span` (of this file), at `key`: found
    /// after parsing, by `--check` or at start.
    pub fn error(
        &self,
        span: std::ops::Range<usize>,
        key: String,
        message: impl Into<String>,
    ) -> ConfigError {
        self.origin.error(span, key, message.into())
    }

    /// The first target: the one of a `[target]` file, and the one whose
    /// `control_socket` and `metrics` the daemon uses.
    pub fn target(&self) -> &TargetSection {
        &self.targets[0]
    }

    /// The key path of target `i` in errors: `target` in a one-target
    /// file, `target[i]` when there are several.
    pub fn target_key(&self, i: usize) -> String {
        if self.targets.len() == 1 {
            "target".into()
        } else {
            format!("target[{i}]")
        }
    }

    /// Validates a configuration built or changed in memory (errors carry
    /// no line).
    pub fn check(&self) -> Result<(), ConfigError> {
        self.validate().map_err(|(_, key, message)| ConfigError {
            file: PathBuf::new(),
            line: 0,
            key,
            message,
        })
    }

    /// Checks what TOML types cannot: names exist and are unique, sizes
    /// make sense, SRP parameters are in range.
    fn validate(&self) -> Result<(), (std::ops::Range<usize>, String, String)> {
        type E = (std::ops::Range<usize>, String, String);
        fn bad<T>(s: &Spanned<T>, key: String, msg: impl Into<String>) -> E {
            (s.span(), key, msg.into())
        }
        if self.targets.is_empty() {
            return Err((
                0..0,
                "target".into(),
                "no target: add a [target] table".into(),
            ));
        }
        for i in 0..self.targets.len() {
            self.validate_target(i)?;
        }
        let mut names = HashSet::new();
        for (i, d) in self.devices.iter().enumerate() {
            let key = |k: &str| format!("device[{i}].{k}");
            let name = d.name.get_ref();
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                return Err(bad(
                    &d.name,
                    key("name"),
                    format!("`{name}` is not a device name (letters, digits, - _ .)"),
                ));
            }
            if !names.insert(name.clone()) {
                return Err(bad(
                    &d.name,
                    key("name"),
                    format!("device `{name}` is defined twice"),
                ));
            }
            let bs = *d.block_size.get_ref();
            if bs != 512 && bs != 4096 {
                return Err(bad(
                    &d.block_size,
                    key("block_size"),
                    format!("{bs} is not 512 or 4096"),
                ));
            }
            let handler = *d.handler.get_ref();
            for (on, k) in [(d.write_through, "write_through"), (d.o_direct, "o_direct")] {
                if on && handler != Handler::FileIo {
                    return Err(bad(
                        &d.handler,
                        key(k),
                        format!("{k} is a vdisk_fileio option, not {}", handler.name()),
                    ));
                }
            }
            if let Some(n) = &d.threads_num {
                if *n.get_ref() > MAX_DEVICE_THREADS {
                    return Err(bad(
                        n,
                        key("threads_num"),
                        format!(
                            "{} threads is more than {MAX_DEVICE_THREADS}: a device's commands \
                             run on at most that many threads of its own; lower it",
                            n.get_ref()
                        ),
                    ));
                }
            }
            if let Some(m) = &d.drbd_minor {
                if handler != Handler::BlockIo && handler != Handler::FileIo {
                    return Err(bad(
                        m,
                        key("drbd_minor"),
                        format!(
                            "a {} device cannot follow a DRBD role: use handler = \
                             \"vdisk_blockio\" on /dev/drbd{}",
                            handler.name(),
                            m.get_ref()
                        ),
                    ));
                }
                if d.read_only {
                    return Err(bad(
                        m,
                        key("drbd_minor"),
                        "a read_only device need not follow a DRBD role: remove read_only or \
                         drbd_minor",
                    ));
                }
            }
            if d.nv_cache && d.write_through {
                return Err(bad(
                    &d.name,
                    key("nv_cache"),
                    "nv_cache says writes are safe in the store's cache, write_through that \
                     each must reach the disk first: set one of them"
                        .to_string(),
                ));
            }
            if handler == Handler::PassThrough || handler == Handler::VCdrom {
                // The device (or the disc) has its own geometry and media
                // options; a CD-ROM is always read-only and removable.
                let span = |set: bool| set.then(|| d.name.span());
                let why = if handler == Handler::PassThrough {
                    "is not a pass-through option: the device behind the sg node has its own"
                } else {
                    "is not a vcdrom option: the disc has 2048-byte blocks, the image's size, \
                     and is read-only and removable"
                };
                for (span, k) in [
                    (d.size.as_ref().map(|s| s.span()), "size"),
                    (span(d.block_size.span() != (0..0)), "block_size"),
                    (
                        span(d.read_only && handler == Handler::PassThrough),
                        "read_only",
                    ),
                    (span(d.thin), "thin"),
                    (span(d.rotational), "rotational"),
                    (
                        span(d.removable && handler == Handler::PassThrough),
                        "removable",
                    ),
                    (span(d.nv_cache), "nv_cache"),
                ] {
                    if let Some(span) = span {
                        return Err((span, key(k), format!("{k} {why}; remove the key")));
                    }
                }
            }
            match handler {
                Handler::PassThrough if d.filename.is_none() => {
                    return Err(bad(
                        &d.handler,
                        key("filename"),
                        "handler pass-through needs a filename: the device's sg node, e.g. \
                         filename = \"/dev/sg1\" (lsscsi -g lists them), or its bsg node \
                         (/dev/bsg/H:C:T:L)",
                    ));
                }
                Handler::FileIo | Handler::BlockIo if d.filename.is_none() => {
                    return Err(bad(
                        &d.handler,
                        key("filename"),
                        format!("handler {} needs a filename", handler.name()),
                    ));
                }
                Handler::Ram | Handler::NullIo if d.size.is_none() => {
                    return Err(bad(
                        &d.handler,
                        key("size"),
                        format!("handler {} needs a size", handler.name()),
                    ));
                }
                Handler::Ram | Handler::NullIo if d.filename.is_some() => {
                    let f = d.filename.as_ref().expect("checked");
                    return Err(bad(
                        f,
                        key("filename"),
                        format!("handler {} takes no filename", handler.name()),
                    ));
                }
                _ => {}
            }
            if let Some(size) = &d.size {
                let n = parse_size(size.get_ref())
                    .map_err(|m| bad(size, key("size"), m.to_string()))?;
                if n < bs as u64 || n % bs as u64 != 0 {
                    return Err(bad(
                        size,
                        key("size"),
                        format!("{n} bytes is not a positive multiple of the block size {bs}"),
                    ));
                }
            }
            for (k, v, max) in [
                ("t10_vendor_id", &d.t10_vendor_id, 8),
                ("t10_product_id", &d.t10_product_id, 16),
                ("usn", &d.usn, 20),
            ] {
                if let Some(v) = v {
                    let s = v.get_ref();
                    if s.is_empty()
                        || s.len() > max
                        || !s.bytes().all(|b| (0x20..0x7f).contains(&b))
                    {
                        return Err(bad(
                            v,
                            key(k),
                            format!("`{s}` must be 1..={max} printable ASCII characters"),
                        ));
                    }
                }
            }
        }
        let check_luns = |luns: &[LunEntry], at: &str| -> Result<(), E> {
            let mut seen = HashSet::new();
            for (j, l) in luns.iter().enumerate() {
                let n = *l.lun.get_ref();
                if n > 16383 {
                    return Err(bad(
                        &l.lun,
                        format!("{at}lun[{j}].lun"),
                        format!("LUN {n} is beyond 16383 (flat addressing)"),
                    ));
                }
                if !seen.insert(n) {
                    return Err(bad(
                        &l.lun,
                        format!("{at}lun[{j}].lun"),
                        format!("LUN {n} is mapped twice"),
                    ));
                }
                if !names.contains(l.device.get_ref()) {
                    return Err(bad(
                        &l.device,
                        format!("{at}lun[{j}].device"),
                        format!("no device named `{}`", l.device.get_ref()),
                    ));
                }
            }
            Ok(())
        };
        check_luns(&self.luns, "")?;
        for (i, t) in self.targets.iter().enumerate() {
            check_luns(&t.luns, &format!("{}.", self.target_key(i)))?;
        }
        let mut groups = HashSet::new();
        for (i, g) in self.groups.iter().enumerate() {
            let at = format!("group[{i}].");
            if g.name.get_ref().is_empty() || !groups.insert(g.name.get_ref().clone()) {
                return Err(bad(
                    &g.name,
                    format!("{at}name"),
                    format!("group name `{}` is empty or used twice", g.name.get_ref()),
                ));
            }
            for (j, init) in g.initiators.iter().enumerate() {
                check_initiator(init.get_ref())
                    .map_err(|m| bad(init, format!("{at}initiators[{j}]"), m.to_string()))?;
            }
            check_luns(&g.luns, &at)?;
        }
        self.validate_alua()
    }

    /// Checks target `i` alone and against the targets before it.
    fn validate_target(&self, i: usize) -> Result<(), (std::ops::Range<usize>, String, String)> {
        type E = (std::ops::Range<usize>, String, String);
        fn bad<T>(s: &Spanned<T>, key: String, msg: impl Into<String>) -> E {
            (s.span(), key, msg.into())
        }
        let t = &self.targets[i];
        let at = self.target_key(i);
        let range = |v: &Spanned<u32>, key: &str, lo: u32, hi: u32| -> Result<(), E> {
            if (lo..=hi).contains(v.get_ref()) {
                Ok(())
            } else {
                Err(bad(
                    v,
                    format!("{at}.{key}"),
                    format!("{} is outside {lo}..={hi}", v.get_ref()),
                ))
            }
        };
        if let Err(e) = rdma_types::Mtu::parse(&t.mtu.get_ref().to_string()) {
            return Err(bad(&t.mtu, format!("{at}.mtu"), e.to_string()));
        }
        range(&t.srp_max_req_size, "srp_max_req_size", 64, 65536)?;
        range(&t.srp_max_rsp_size, "srp_max_rsp_size", 36, 65536)?;
        range(&t.srp_max_rdma_size, "srp_max_rdma_size", 4096, 1 << 24)?;
        range(&t.srpt_srq_size, "srpt_srq_size", 16, 65535)?;
        range(&t.srpt_sq_size, "srpt_sq_size", 16, 65535)?;
        range(&t.max_channels, "max_channels", 1, 1 << 20)?;
        range(&t.max_pending_logins, "max_pending_logins", 1, 1 << 20)?;
        range(
            &t.max_pending_per_initiator,
            "max_pending_per_initiator",
            1,
            1 << 20,
        )?;
        let ms = |v: &Spanned<u64>, key: &str, lo: u64| {
            if *v.get_ref() == 0 && key == "keepalive_ms" || (lo..=3_600_000).contains(v.get_ref())
            {
                Ok(())
            } else {
                Err(bad(
                    v,
                    format!("{at}.{key}"),
                    format!("{} ms is outside {lo}..=3600000", v.get_ref()),
                ))
            }
        };
        ms(&t.login_timeout_ms, "login_timeout_ms", 100)?;
        ms(&t.keepalive_ms, "keepalive_ms", 100)?;
        if t.rdma_cm_port == 0 && !t.ib_cm {
            return Err((
                0..0,
                format!("{at}.rdma_cm_port"),
                "0 turns RDMA CM off, and ib_cm = false leaves no way to log in".into(),
            ));
        }
        if let Some(d) = &t.device {
            if let Err(e) = d.get_ref().parse::<rdmacore::DeviceSpec>() {
                return Err(bad(d, format!("{at}.device"), e));
            }
            if t.fabric == rdma_access::subnet::Fabric::Ib {
                return Err(bad(
                    d,
                    format!("{at}.device"),
                    "an rdma-core device's subnet is run by the kernel and its SM, not by \
                     srptd: remove fabric = \"ib\" (or the device)",
                ));
            }
            if t.rdma_cm_port == 0 {
                return Err(bad(
                    d,
                    format!("{at}.device"),
                    "on an rdma-core device logins come by RDMA CM only, and rdma_cm_port = 0 \
                     turns it off: set rdma_cm_port (ib_srpt's usual is 5555)",
                ));
            }
        }
        if *t.iwarp.get_ref() {
            let refuse = |m: &str| Err(bad(&t.iwarp, format!("{at}.iwarp"), m));
            if t.device.is_some() {
                return refuse(
                    "iwarp and device both choose the port's NIC (srptd's own soft iWARP NIC, or \
                     an rdma-core device such as Linux siw): remove one",
                );
            }
            if t.fabric == rdma_access::subnet::Fabric::Ib {
                return refuse(
                    "the ib fabric is a subnet our SM manages over soft RoCE; iWARP has none: \
                     remove fabric = \"ib\" (or iwarp)",
                );
            }
            if t.rdma_cm_port == 0 {
                return refuse(
                    "on iWARP logins come by RDMA CM only (TCP and MPA), and rdma_cm_port = 0 \
                     turns it off: set rdma_cm_port (ib_srpt's usual is 5555)",
                );
            }
        }
        if *t.rel_tgt_id.get_ref() == 0 {
            return Err(bad(
                &t.rel_tgt_id,
                format!("{at}.rel_tgt_id"),
                "must not be 0",
            ));
        }
        if let Err(e) = t.pkey.get_ref().pkeys() {
            return Err(bad(&t.pkey, format!("{at}.pkey"), e.to_string()));
        }
        for (j, o) in self.targets[..i].iter().enumerate() {
            let other = self.target_key(j);
            // The address is the port's GID and so its name (SCST names a
            // target by its port GID): one port, one target.
            if o.device.is_none() && t.device.is_none() && o.ip.get_ref() == t.ip.get_ref() {
                return Err(bad(
                    &t.ip,
                    format!("{at}.ip"),
                    format!(
                        "{} is {other}'s address too: two targets cannot share a port (GID)",
                        t.ip.get_ref()
                    ),
                ));
            }
            if o.rel_tgt_id.get_ref() == t.rel_tgt_id.get_ref() {
                return Err(bad(
                    &t.rel_tgt_id,
                    format!("{at}.rel_tgt_id"),
                    format!(
                        "{} is {other}'s rel_tgt_id too: ports of one SCSI target need their own",
                        t.rel_tgt_id.get_ref()
                    ),
                ));
            }
        }
        if i > 0 {
            if let Some(m) = &t.metrics {
                return Err(bad(
                    m,
                    format!("{at}.metrics"),
                    "the metrics endpoint is the daemon's: set it in the first target",
                ));
            }
            let (first, this) = (
                self.targets[0].control_socket.get_ref(),
                t.control_socket.get_ref(),
            );
            if this != first && *this != default_control_socket() {
                return Err((
                    t.control_socket.span(),
                    format!("{at}.control_socket"),
                    format!(
                        "the control socket is the daemon's ({}): set it in the first target",
                        first.display()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The file as `srptadm write-config` saves it.
    pub fn to_toml(&self) -> String {
        let body = toml::to_string(self).unwrap_or_else(|e| format!("# cannot serialise: {e}\n"));
        format!("# srptd configuration, written by srptd\n{body}")
    }
}

/// Why an initiator name pattern is refused; each names the pattern.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InitiatorError {
    #[error("initiator `{0}` must start with 0x (the initiator port identifier)")]
    NoHexPrefix(String),
    #[error("initiator `{0}`: expected up to 32 hex digits after 0x")]
    NotHex(String),
    #[error(
        "initiator `{0}`: a full port identifier has 32 hex digits (end with * to match a prefix)"
    )]
    Short(String),
    #[error("initiator `{0}`: write hex digits in lower case, as sessions are named")]
    UpperCase(String),
}

/// Checks an initiator name pattern: `0x` and up to 32 hex digits, with an
/// optional trailing `*`.
pub fn check_initiator(s: &str) -> Result<(), InitiatorError> {
    let body = s.strip_suffix('*').unwrap_or(s);
    let hex = body
        .strip_prefix("0x")
        .ok_or_else(|| InitiatorError::NoHexPrefix(s.to_string()))?;
    if hex.len() > 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(InitiatorError::NotHex(s.to_string()));
    }
    if !s.ends_with('*') && hex.len() != 32 {
        return Err(InitiatorError::Short(s.to_string()));
    }
    if hex.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(InitiatorError::UpperCase(s.to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
