//! Login strings in the form Linux `ib_srp` accepts through
//! `/sys/class/infiniband_srp/srp-<hca>-<port>/add_target`, e.g.
//! `id_ext=0002c903000f1366,ioc_guid=0002c903000f1366,dest=192.168.5.1:5000`.
//!
//! Keys, ranges and defaults follow `ib_srp`'s `srp_parse_options`; an
//! unknown key is an error that names the key.
//!
//! What each key does here, as in ib_srp ([`LoginOptions::session_config`],
//! [`LoginOptions::apply_to_disk`]): `tl_retry_count` is the QP's transport
//! `retry_cnt`; `max_sect` the largest transfer of one command (longer
//! I/O is split); `sg_tablesize` the data descriptors one command may
//! carry; `max_cmd_per_lun` how many commands one LUN may have in flight
//! (the SCSI device's queue depth); `target_can_queue` how many all LUNs
//! of the target may have together (the SCSI target's `can_queue`);
//! `queue_size` the channel's queue (the host's `can_queue`).
//! `comp_vector` picks which interrupt vector, and so which CPU, handles a
//! channel's completions in Linux; our providers have one completion
//! thread per CA and nothing to pick, so the key is accepted, kept and
//! printed back for compatibility and selects nothing.
//!
//! One key is ours: `register_always=1` gives each command's data an
//! R_Key of its own ([`SessionConfig::register_always`]); ib_srp has the
//! same choice as a module parameter of that name. A login string with it
//! is printed back with it, and Linux's `add_target` refuses the key.

use crate::disk::{Disk, QueueLimit};
use crate::session::SessionConfig;
use rdma_types::{Gid, Guid, Pkey};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use thiserror::Error;

/// SRP IO class values (SRP r10 and r16a; `io_class=` accepts only these).
pub const IO_CLASS_REV10: u16 = 0xff00;
/// SRP r16a IO class, the default.
pub const IO_CLASS_REV16A: u16 = 0x0100;

/// How to reach the target port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetAddress {
    /// IB CM: destination GID, P_Key and service ID.
    IbCm {
        /// Target port GID.
        dgid: Gid,
        /// Partition key.
        pkey: Pkey,
        /// Service ID to connect to.
        service_id: u64,
    },
    /// RDMA CM: IP address and port (RoCE, iWARP, or IPoIB).
    RdmaCm {
        /// Destination address and port.
        dest: SocketAddr,
        /// Optional source address.
        src: Option<IpAddr>,
    },
}

/// A parsed login string with `ib_srp`'s defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginOptions {
    /// Target port identifier extension.
    pub id_ext: u64,
    /// IO controller GUID.
    pub ioc_guid: u64,
    /// Where the target is.
    pub address: TargetAddress,
    /// Largest request in 512-byte sectors.
    pub max_sect: u32,
    /// Queue depth per LUN.
    pub max_cmd_per_lun: u32,
    /// Commands in flight per channel (`can_queue`).
    pub queue_size: u32,
    /// Number of RDMA channels; `None` lets the initiator choose.
    pub ch_count: Option<u32>,
    /// Descriptors in the SRP_CMD IU (1..=255).
    pub cmd_sg_entries: u32,
    /// Allow external indirect descriptor tables.
    pub allow_ext_sg: bool,
    /// Scatter/gather entries per command (1..=2048).
    pub sg_tablesize: u32,
    /// Completion vector of the first channel.
    pub comp_vector: u32,
    /// IB transport retry count (2..=7).
    pub tl_retry_count: u8,
    /// Initiator port identifier extension.
    pub initiator_ext: u64,
    /// Largest initiator-to-target IU; 0 = computed.
    pub max_it_iu_size: u32,
    /// Target queue depth hint.
    pub target_can_queue: Option<u32>,
    /// IO class (rev10 or rev16a).
    pub io_class: u16,
    /// A memory window per command (`register_always=1`, see the module
    /// docs).
    pub register_always: bool,
}

/// Why a login string was refused. Each error names the key and value.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LoginError {
    /// A key `ib_srp` does not know, or an item without `=`.
    #[error("unknown parameter or missing value '{0}' in login string")]
    UnknownKey(String),
    /// A value that does not parse or is out of range.
    #[error("bad {key} parameter '{value}': {why}")]
    BadValue {
        /// The key.
        key: &'static str,
        /// The value as given.
        value: String,
        /// What was expected.
        why: &'static str,
    },
    /// Mandatory keys are missing.
    #[error("login string is missing {0}; give id_ext, ioc_guid and either dest=<ip>:<port> or dgid, pkey and service_id")]
    Missing(String),
}

/// A GID as a login string's `dgid=` writes it: 32 hex digits.
pub fn dgid_hex(dgid: &Gid) -> String {
    dgid.0.iter().map(|b| format!("{b:02x}")).collect()
}

/// The keys of a login string that name the target port: `id_ext`,
/// `ioc_guid` and the address (`dgid`, `pkey`, `service_id`, or `dest`
/// and `src`), as `srp_daemon -c` prints them.
pub fn target_keys(id_ext: u64, ioc_guid: u64, address: &TargetAddress) -> String {
    let mut s = format!("id_ext={id_ext:016x},ioc_guid={ioc_guid:016x}");
    match address {
        TargetAddress::IbCm {
            dgid,
            pkey,
            service_id,
        } => {
            s += &format!(
                ",dgid={},pkey={:04x},service_id={service_id:016x}",
                dgid_hex(dgid),
                pkey.0
            );
        }
        TargetAddress::RdmaCm { dest, src } => {
            s += &format!(",dest={dest}");
            if let Some(src) = src {
                match src {
                    IpAddr::V4(a) => s += &format!(",src={a}"),
                    IpAddr::V6(a) => s += &format!(",src=[{a}]"),
                }
            }
        }
    }
    s
}

/// `ib_srp` defaults (module parameters `cmd_sg_entries=12`, `allow_ext_sg=0`,
/// queue size 64, 1024-sector requests, `tl_retry_count=7`).
const DEFAULT_CMD_SG_ENTRIES: u32 = 12;
const DEFAULT_QUEUE_SIZE: u32 = 64;
const DEFAULT_MAX_SECT: u32 = 1024;
const SG_MAX_SEGMENTS: u32 = 2048;

fn hex_u64(key: &'static str, v: &str) -> Result<u64, LoginError> {
    let digits = v.strip_prefix("0x").unwrap_or(v);
    if digits.is_empty() || digits.len() > 16 {
        return Err(bad(key, v, "expected up to 16 hex digits"));
    }
    u64::from_str_radix(digits, 16).map_err(|_| bad(key, v, "expected hex digits"))
}

fn int(
    key: &'static str,
    v: &str,
    min: i64,
    max: i64,
    why: &'static str,
) -> Result<u32, LoginError> {
    match v.parse::<i64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n as u32),
        _ => Err(bad(key, v, why)),
    }
}

fn bad(key: &'static str, v: &str, why: &'static str) -> LoginError {
    LoginError::BadValue {
        key,
        value: v.to_string(),
        why,
    }
}

/// Parses `ip:port` or `[ipv6]:port` (as `srp_parse_in` does).
fn socket_addr(
    key: &'static str,
    v: &str,
    need_port: bool,
) -> Result<(IpAddr, Option<u16>), LoginError> {
    let (host, port) = match v.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') && (h.starts_with('[') || !h.contains(':')) => {
            (h, Some(p))
        }
        _ => (v, None),
    };
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let ip: IpAddr = host
        .parse()
        .map_err(|_| bad(key, v, "expected <ipv4>:<port> or [<ipv6>]:<port>"))?;
    let port = match port {
        Some(p) => Some(
            p.parse::<u16>()
                .map_err(|_| bad(key, v, "port must be 0..=65535"))?,
        ),
        None if need_port => return Err(bad(key, v, "a port number is required")),
        None => None,
    };
    Ok((ip, port))
}

impl LoginOptions {
    /// Parses a login string. Items are separated by `,` or newlines; empty
    /// items are skipped; a later value for a key replaces an earlier one.
    ///
    /// # Errors
    /// [`LoginError`] naming the key, the value and the rule it broke.
    pub fn parse(s: &str) -> Result<LoginOptions, LoginError> {
        let mut id_ext = None;
        let mut ioc_guid = None;
        let mut dgid = None;
        let mut pkey = None;
        let mut service_id = None;
        let mut dest = None;
        let mut src = None;
        let mut o = LoginOptions {
            id_ext: 0,
            ioc_guid: 0,
            address: TargetAddress::RdmaCm {
                dest: SocketAddr::from(([0, 0, 0, 0], 0)),
                src: None,
            },
            max_sect: DEFAULT_MAX_SECT,
            max_cmd_per_lun: DEFAULT_QUEUE_SIZE,
            queue_size: DEFAULT_QUEUE_SIZE,
            ch_count: None,
            cmd_sg_entries: DEFAULT_CMD_SG_ENTRIES,
            allow_ext_sg: false,
            sg_tablesize: DEFAULT_CMD_SG_ENTRIES,
            comp_vector: 0,
            tl_retry_count: 7,
            initiator_ext: 0,
            max_it_iu_size: 0,
            target_can_queue: None,
            io_class: IO_CLASS_REV16A,
            register_always: false,
        };
        let mut cmd_per_lun_given = false;
        let mut sg_tablesize_given = false;
        for item in s
            .split([',', '\n'])
            .map(str::trim)
            .filter(|i| !i.is_empty())
        {
            let Some((key, v)) = item.split_once('=').filter(|(_, v)| !v.is_empty()) else {
                return Err(LoginError::UnknownKey(item.to_string()));
            };
            match key {
                "id_ext" => id_ext = Some(hex_u64("id_ext", v)?),
                "ioc_guid" => ioc_guid = Some(hex_u64("ioc_guid", v)?),
                "dgid" => {
                    if v.len() != 32 {
                        return Err(bad("dgid", v, "expected 32 hex digits"));
                    }
                    dgid = Some(
                        Gid::parse_hex(v)
                            .ok_or_else(|| bad("dgid", v, "expected 32 hex digits"))?,
                    );
                }
                "pkey" => {
                    let d = v.strip_prefix("0x").unwrap_or(v);
                    let p = u16::from_str_radix(d, 16)
                        .map_err(|_| bad("pkey", v, "expected a 16-bit hex P_Key"))?;
                    pkey = Some(Pkey(p));
                }
                "service_id" => service_id = Some(hex_u64("service_id", v)?),
                "dest" => {
                    let (ip, port) = socket_addr("dest", v, true)?;
                    dest = Some(SocketAddr::new(ip, port.unwrap_or(0)));
                }
                "src" => src = Some(socket_addr("src", v, false)?.0),
                "max_sect" => {
                    o.max_sect = int(
                        "max_sect",
                        v,
                        1,
                        i64::from(u32::MAX),
                        "expected a positive number of 512-byte sectors",
                    )?
                }
                "queue_size" => {
                    o.queue_size = int("queue_size", v, 1, 65535, "expected 1..=65535")?;
                    if !cmd_per_lun_given {
                        o.max_cmd_per_lun = o.queue_size;
                    }
                }
                "max_cmd_per_lun" => {
                    o.max_cmd_per_lun = int("max_cmd_per_lun", v, 1, 65535, "expected 1..=65535")?;
                    cmd_per_lun_given = true;
                }
                "target_can_queue" => {
                    o.target_can_queue =
                        Some(int("target_can_queue", v, 1, 65535, "expected 1..=65535")?)
                }
                "io_class" => {
                    let d = v.strip_prefix("0x").unwrap_or(v);
                    match u16::from_str_radix(d, 16) {
                        Ok(c) if c == IO_CLASS_REV10 || c == IO_CLASS_REV16A => o.io_class = c,
                        _ => {
                            return Err(bad(
                                "io_class",
                                v,
                                "use ff00 (SRP rev10) or 100 (SRP rev16a)",
                            ))
                        }
                    }
                }
                "initiator_ext" => o.initiator_ext = hex_u64("initiator_ext", v)?,
                "cmd_sg_entries" => {
                    o.cmd_sg_entries = int("cmd_sg_entries", v, 1, 255, "expected 1..=255")?
                }
                "register_always" => {
                    o.register_always = int("register_always", v, 0, 1, "expected 0 or 1")? == 1
                }
                "allow_ext_sg" => {
                    o.allow_ext_sg = v
                        .parse::<i64>()
                        .map_err(|_| bad("allow_ext_sg", v, "expected an integer"))?
                        != 0
                }
                "sg_tablesize" => {
                    o.sg_tablesize = int(
                        "sg_tablesize",
                        v,
                        1,
                        i64::from(SG_MAX_SEGMENTS),
                        "expected 1..=2048",
                    )?;
                    sg_tablesize_given = true;
                }
                "comp_vector" => {
                    o.comp_vector = int(
                        "comp_vector",
                        v,
                        0,
                        i64::from(u32::MAX),
                        "expected a non-negative number",
                    )?
                }
                "tl_retry_count" => {
                    o.tl_retry_count = int(
                        "tl_retry_count",
                        v,
                        2,
                        7,
                        "must be a number between 2 and 7",
                    )? as u8
                }
                "max_it_iu_size" => {
                    o.max_it_iu_size = int(
                        "max_it_iu_size",
                        v,
                        0,
                        i64::from(u32::MAX),
                        "expected a non-negative number",
                    )?
                }
                "ch_count" => {
                    o.ch_count = Some(int("ch_count", v, 1, 65535, "expected at least 1")?)
                }
                _ => return Err(LoginError::UnknownKey(item.to_string())),
            }
        }
        if !sg_tablesize_given {
            o.sg_tablesize = o.cmd_sg_entries;
        }
        let mut missing = Vec::new();
        if id_ext.is_none() {
            missing.push("id_ext");
        }
        if ioc_guid.is_none() {
            missing.push("ioc_guid");
        }
        o.address = match (dest, dgid, pkey, service_id) {
            (Some(dest), _, _, _) => TargetAddress::RdmaCm { dest, src },
            (None, Some(dgid), Some(pkey), Some(service_id)) => TargetAddress::IbCm {
                dgid,
                pkey,
                service_id,
            },
            (None, dgid, pkey, service_id) => {
                if dgid.is_none() && pkey.is_none() && service_id.is_none() {
                    missing.push("dest (or dgid, pkey and service_id)");
                } else {
                    for (name, absent) in [
                        ("dgid", dgid.is_none()),
                        ("pkey", pkey.is_none()),
                        ("service_id", service_id.is_none()),
                    ] {
                        if absent {
                            missing.push(name);
                        }
                    }
                }
                TargetAddress::RdmaCm {
                    dest: SocketAddr::from(([0, 0, 0, 0], 0)),
                    src,
                }
            }
        };
        if !missing.is_empty() {
            return Err(LoginError::Missing(missing.join(", ")));
        }
        o.id_ext = id_ext.unwrap_or_default();
        o.ioc_guid = ioc_guid.unwrap_or_default();
        Ok(o)
    }

    /// The SRP channel settings of this login for the initiator port on
    /// CA `initiator_guid`: port identifiers, IO class, `cmd_sg_entries`,
    /// `allow_ext_sg`, `max_it_iu_size` and `queue_size`.
    pub fn channel_config(&self, initiator_guid: Guid) -> srp::initiator::ChannelConfig {
        let mut chan = srp::initiator::ChannelConfig::new(
            self.initiator_ext,
            initiator_guid,
            self.id_ext,
            Guid(self.ioc_guid),
        );
        chan.io_class_rev10 = self.io_class == IO_CLASS_REV10;
        chan.cmd_sg_entries = self.cmd_sg_entries.clamp(1, 255) as u8;
        chan.max_it_iu_size = self.max_it_iu_size;
        chan.allow_ext_sg = self.allow_ext_sg;
        chan.can_queue = self.queue_size.clamp(2, u32::from(u16::MAX)) as u16;
        chan
    }

    /// Session settings of this login: the channel
    /// ([`LoginOptions::channel_config`]), the partition of an IB CM login,
    /// a data pool that holds the largest transfer twice over,
    /// `tl_retry_count` as the QP's `retry_cnt` and `sg_tablesize`.
    pub fn session_config(&self, initiator_guid: Guid) -> SessionConfig {
        let mut cfg = SessionConfig::new(self.channel_config(initiator_guid));
        if let TargetAddress::IbCm { pkey, .. } = &self.address {
            cfg.pkey = Some(*pkey);
        }
        cfg.pool_bytes = cfg
            .pool_bytes
            .max(self.max_transfer_bytes().saturating_mul(2));
        cfg.retry_cnt = self.tl_retry_count;
        cfg.sg_tablesize = self.sg_tablesize;
        cfg.register_always = self.register_always;
        cfg
    }

    /// The largest transfer of one command in bytes (`max_sect` sectors
    /// of 512 bytes, as the SCSI host's `max_sectors`).
    pub fn max_transfer_bytes(&self) -> usize {
        (self.max_sect as usize).saturating_mul(512)
    }

    /// A LUN's queue limit (`max_cmd_per_lun`); make one per LUN and keep
    /// it across reconnects.
    pub fn lun_queue(&self) -> Arc<QueueLimit> {
        QueueLimit::new(self.max_cmd_per_lun as usize)
    }

    /// The target's queue limit shared by all its LUNs
    /// (`target_can_queue`), if given; make one per login.
    pub fn target_queue(&self) -> Option<Arc<QueueLimit>> {
        self.target_can_queue.map(|n| QueueLimit::new(n as usize))
    }

    /// Applies the per-command and queue limits to a LUN just opened:
    /// `max_sect` caps each command, `lun` (from [`LoginOptions::lun_queue`])
    /// and `target` (from [`LoginOptions::target_queue`]) bound the
    /// commands in flight.
    pub fn apply_to_disk(
        &self,
        disk: Disk,
        lun: Arc<QueueLimit>,
        target: Option<Arc<QueueLimit>>,
    ) -> Disk {
        let mut disk = disk.with_queue_limits(Some(lun), target);
        disk.limit_transfer(self.max_transfer_bytes());
        disk
    }

    /// The login string that parses back to these options (canonical form,
    /// as `srp_daemon` would print it).
    pub fn to_login_string(&self) -> String {
        let mut s = target_keys(self.id_ext, self.ioc_guid, &self.address);
        s += &format!(
            ",max_sect={},max_cmd_per_lun={},queue_size={},cmd_sg_entries={},allow_ext_sg={},sg_tablesize={},comp_vector={},tl_retry_count={},initiator_ext={:016x},max_it_iu_size={},io_class={:x}",
            self.max_sect,
            self.max_cmd_per_lun,
            self.queue_size,
            self.cmd_sg_entries,
            u8::from(self.allow_ext_sg),
            self.sg_tablesize,
            self.comp_vector,
            self.tl_retry_count,
            self.initiator_ext,
            self.max_it_iu_size,
            self.io_class
        );
        if let Some(c) = self.ch_count {
            s += &format!(",ch_count={c}");
        }
        if let Some(c) = self.target_can_queue {
            s += &format!(",target_can_queue={c}");
        }
        if self.register_always {
            s += ",register_always=1";
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rdma_cm_login_from_the_scst_readme() {
        let o = LoginOptions::parse(
            "dest=192.168.5.1:5000,id_ext=0002c90300a34270,ioc_guid=0002c90300a34270",
        )
        .unwrap();
        assert_eq!(o.id_ext, 0x0002_c903_00a3_4270);
        assert_eq!(o.ioc_guid, 0x0002_c903_00a3_4270);
        assert_eq!(
            o.address,
            TargetAddress::RdmaCm {
                dest: "192.168.5.1:5000".parse().unwrap(),
                src: None
            }
        );
        assert_eq!(
            (
                o.cmd_sg_entries,
                o.sg_tablesize,
                o.queue_size,
                o.max_cmd_per_lun
            ),
            (12, 12, 64, 64)
        );
        assert_eq!(o.io_class, IO_CLASS_REV16A);
    }

    /// `register_always`: ours, 0 or 1, into the session and back out.
    #[test]
    fn register_always_is_carried_to_the_session_and_printed_back() {
        let base = "dest=10.0.0.1:5555,id_ext=1,ioc_guid=1";
        let o = LoginOptions::parse(base).unwrap();
        assert!(!o.register_always);
        assert!(!o.session_config(Guid(9)).register_always);
        assert!(!o.to_login_string().contains("register_always"));
        let o = LoginOptions::parse(&format!("{base},register_always=1")).unwrap();
        assert!(o.session_config(Guid(9)).register_always);
        let again = LoginOptions::parse(&o.to_login_string()).unwrap();
        assert!(again.register_always);
        assert_eq!(
            LoginOptions::parse(&format!("{base},register_always=2")).unwrap_err(),
            LoginError::BadValue {
                key: "register_always",
                value: "2".into(),
                why: "expected 0 or 1"
            }
        );
    }

    #[test]
    fn ib_cm_login_from_the_scst_readme() {
        let o = LoginOptions::parse(
            "id_ext=0002c903000f1366,ioc_guid=0002c903000f1366,dgid=fe800000000000000002c903000f1367,pkey=ffff,service_id=0002c903000f1366",
        )
        .unwrap();
        let TargetAddress::IbCm {
            dgid,
            pkey,
            service_id,
        } = o.address
        else {
            panic!("IB CM expected")
        };
        assert_eq!(
            dgid.to_scst_name(),
            "fe80:0000:0000:0000:0002:c903:000f:1367"
        );
        assert_eq!(pkey, Pkey::DEFAULT);
        assert_eq!(service_id, 0x0002_c903_000f_1366);
    }

    #[test]
    fn every_tuning_key_and_round_trip() {
        let s = "id_ext=1,ioc_guid=2,dest=[fd00::5]:5555,src=[fd00::1],max_sect=8192,queue_size=128,max_cmd_per_lun=32,ch_count=4,cmd_sg_entries=255,allow_ext_sg=1,sg_tablesize=512,comp_vector=3,tl_retry_count=2,initiator_ext=abc,max_it_iu_size=8260,target_can_queue=256,io_class=ff00";
        let o = LoginOptions::parse(s).unwrap();
        assert_eq!(
            o.address,
            TargetAddress::RdmaCm {
                dest: "[fd00::5]:5555".parse().unwrap(),
                src: Some("fd00::1".parse().unwrap())
            }
        );
        assert_eq!(
            (o.max_sect, o.queue_size, o.max_cmd_per_lun, o.ch_count),
            (8192, 128, 32, Some(4))
        );
        assert_eq!(
            (
                o.cmd_sg_entries,
                o.allow_ext_sg,
                o.sg_tablesize,
                o.comp_vector
            ),
            (255, true, 512, 3)
        );
        assert_eq!(
            (
                o.tl_retry_count,
                o.initiator_ext,
                o.max_it_iu_size,
                o.target_can_queue,
                o.io_class
            ),
            (2, 0xabc, 8260, Some(256), IO_CLASS_REV10)
        );
        assert_eq!(LoginOptions::parse(&o.to_login_string()).unwrap(), o);
    }

    #[test]
    fn queue_size_sets_cmd_per_lun_unless_given() {
        let o = LoginOptions::parse("id_ext=1,ioc_guid=1,dest=1.2.3.4:5,queue_size=100").unwrap();
        assert_eq!(o.max_cmd_per_lun, 100);
        let o = LoginOptions::parse(
            "id_ext=1,ioc_guid=1,dest=1.2.3.4:5,max_cmd_per_lun=8,queue_size=100",
        )
        .unwrap();
        assert_eq!(o.max_cmd_per_lun, 8);
    }

    #[test]
    fn every_error_names_its_key() {
        let base = "id_ext=1,ioc_guid=1,dest=1.2.3.4:5";
        let cases: &[(&str, &str)] = &[
            (
                "frobnicate=1",
                "unknown parameter or missing value 'frobnicate=1'",
            ),
            ("dest", "unknown parameter or missing value 'dest'"),
            (
                "max_sect=",
                "unknown parameter or missing value 'max_sect='",
            ),
            ("id_ext=xyz", "bad id_ext parameter 'xyz'"),
            ("ioc_guid=11112222333344445", "bad ioc_guid parameter"),
            (
                "dest=1.2.3.4",
                "bad dest parameter '1.2.3.4': a port number is required",
            ),
            ("dest=1.2.3.4:99999", "port must be 0..=65535"),
            ("dest=host:5", "bad dest parameter 'host:5'"),
            (
                "cmd_sg_entries=0",
                "bad cmd_sg_entries parameter '0': expected 1..=255",
            ),
            ("cmd_sg_entries=256", "bad cmd_sg_entries parameter '256'"),
            ("sg_tablesize=4096", "bad sg_tablesize parameter"),
            ("tl_retry_count=1", "must be a number between 2 and 7"),
            ("tl_retry_count=8", "must be a number between 2 and 7"),
            ("queue_size=0", "bad queue_size parameter '0'"),
            ("max_cmd_per_lun=-1", "bad max_cmd_per_lun parameter"),
            (
                "ch_count=0",
                "bad ch_count parameter '0': expected at least 1",
            ),
            ("comp_vector=-2", "bad comp_vector parameter"),
            ("io_class=1234", "use ff00 (SRP rev10) or 100 (SRP rev16a)"),
            ("pkey=fffff", "bad pkey parameter"),
            (
                "dgid=fe80",
                "bad dgid parameter 'fe80': expected 32 hex digits",
            ),
            ("target_can_queue=0", "bad target_can_queue parameter"),
            ("max_it_iu_size=-5", "bad max_it_iu_size parameter"),
            (
                "allow_ext_sg=yes",
                "bad allow_ext_sg parameter 'yes': expected an integer",
            ),
        ];
        for (extra, want) in cases {
            let err = LoginOptions::parse(&format!("{base},{extra}"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{extra}: got '{err}', want '{want}'");
        }
    }

    #[test]
    fn missing_keys_are_listed() {
        let e = LoginOptions::parse("dest=1.2.3.4:5")
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing id_ext, ioc_guid"), "{e}");
        let e = LoginOptions::parse("id_ext=1,ioc_guid=1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("dest (or dgid, pkey and service_id)"), "{e}");
        let e = LoginOptions::parse("id_ext=1,ioc_guid=1,dgid=fe800000000000000002c903000f1367")
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing pkey, service_id"), "{e}");
    }

    #[test]
    fn separators_and_empty_items() {
        let o = LoginOptions::parse("id_ext=1,,ioc_guid=2\ndest=10.0.0.1:4420,\n").unwrap();
        assert_eq!(o.ioc_guid, 2);
    }
}
