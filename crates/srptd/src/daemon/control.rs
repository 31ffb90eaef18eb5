//! srptd's control socket: the admin [`Request`]s `srptadm` sends, the
//! socket made mode 0600 and checked for the peer's user, one JSON line per
//! request and answer.

use super::*;
use daemon_ctl::{request_to, serve_lines, RequestError};
use std::path::PathBuf;

/// One admin request, as JSON on the control socket (`{"cmd": "..."}`).
/// The same type is `srptadm`'s command line (each variant a subcommand,
/// its help from the `about` texts), so the two cannot drift apart; the
/// two whose command line differs from their JSON (`add-device` takes
/// flags and sends TOML, `set log-level`) are `srptadm`'s own.
#[derive(Debug, Clone, Deserialize, Serialize, clap::Subcommand)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum Request {
    /// Target name, address, parameters, state.
    #[command(about = "Target name, address, SRP parameters")]
    Show,
    /// Channels with credits and commands in flight.
    #[command(about = "Logged-in channels: initiator, credits, commands in flight")]
    Sessions,
    /// Devices with handler, size and counters.
    #[command(about = "Devices with handler, size, IDs and counters")]
    Devices,
    /// The default LUNs and the groups.
    #[command(about = "Default LUNs and groups")]
    Luns,
    /// Adds a device given as a `[[device]]` table body in TOML.
    #[command(skip)]
    AddDevice { toml: String },
    #[command(about = "Remove a device that no LUN maps")]
    RemoveDevice {
        /// The device's name.
        name: String,
    },
    /// Grows a device to `size` (K/M/G/T suffixes): CAPACITY DATA HAS
    /// CHANGED for every nexus that sees it and SRP_AER_REQ to its
    /// initiators (SCST's `resync_size`).
    #[command(
        about = "Grow a ram device to SIZE (e.g. 64M): initiators that see it get \
                 CAPACITY DATA HAS CHANGED and an SRP_AER_REQ. Shrinking is refused"
    )]
    Resize {
        /// The device's name.
        device: String,
        /// The new size: bytes, or with K, M, G, T (64M, 1G).
        #[arg(value_parser = crate::config::size_arg)]
        size: String,
    },
    /// Puts another ISO image in a vcdrom device, or takes its disc out
    /// (SCST's vcdrom `filename` attribute).
    #[command(
        about = "Put another ISO image in a vcdrom device (no IMAGE: eject its disc): \
                 initiators that see it get NOT READY TO READY CHANGE (28/00)"
    )]
    ChangeMedium {
        /// The vcdrom device's name.
        device: String,
        /// The image file (an empty file: no disc); absent: eject.
        image: Option<PathBuf>,
    },
    /// Maps a device; `group` absent means the default LUNs.
    #[command(about = "Map a device at a LUN (of a group, or the default LUNs)")]
    AddLun {
        /// The group whose LUN it is (default: the default LUNs).
        #[arg(long)]
        group: Option<String>,
        /// The LUN number.
        lun: u32,
        /// The device's name.
        device: String,
    },
    #[command(about = "Unmap a LUN")]
    RemoveLun {
        /// The group whose LUN it is (default: the default LUNs).
        #[arg(long)]
        group: Option<String>,
        /// The LUN number.
        lun: u32,
    },
    #[command(about = "Create a LUN group")]
    AddGroup {
        /// The group's name.
        name: String,
    },
    #[command(about = "Remove a group; its initiators see the default LUNs again")]
    RemoveGroup {
        /// The group's name.
        name: String,
    },
    #[command(about = "Add an initiator name (0x + 32 hex digits, or a prefix ending in *)")]
    AddInitiator {
        /// The group's name.
        group: String,
        /// The initiator port name (as `srptadm sessions` shows it).
        initiator: String,
    },
    #[command(about = "Remove an initiator name from a group")]
    RemoveInitiator {
        /// The group's name.
        group: String,
        /// The initiator port name, as added.
        initiator: String,
    },
    /// Accept logins on `target` (a name or address), or on every target.
    #[command(about = "Accept logins")]
    Enable {
        /// Only this target (its name or address); all without it.
        #[arg(long)]
        #[serde(default)]
        target: Option<String>,
    },
    /// Refuse logins on `target`, or on every target, and log its
    /// initiators out.
    #[command(about = "Refuse logins and log every initiator out")]
    Disable {
        /// Only this target (its name or address); all without it.
        #[arg(long)]
        #[serde(default)]
        target: Option<String>,
    },
    /// The target port groups (ALUA): ID, state, ports.
    #[command(about = "Target port groups (ALUA): group_id, state, preferred, ports")]
    TargetGroups,
    /// An implicit ALUA transition of one target port group.
    #[command(
        about = "Set a target port group's asymmetric access state (active, nonoptimized, \
                 standby, unavailable, transitioning): every session gets ASYMMETRIC ACCESS \
                 STATE CHANGED"
    )]
    SetGroupState {
        /// The group's name or group_id.
        group: String,
        /// active, nonoptimized, standby, unavailable or transitioning.
        state: StateArg,
    },
    /// DRBD devices: the role each follows, what the status file says,
    /// whether srptd holds it open.
    #[command(
        about = "DRBD devices (drbd_minor): the role the status file says, the role srptd \
                 follows, whether it holds the device open"
    )]
    Roles,
    /// This host is (about to be) `role` for a DRBD device: `primary`
    /// opens it and makes its target port groups active; `secondary`
    /// makes them transitioning, waits for in-flight commands, closes
    /// the device and makes them standby (then `drbdadm secondary` can
    /// run).
    #[command(
        about = "Follow a DRBD role: primary opens DEVICE and makes its target port groups \
                 active; secondary waits for its in-flight commands, closes it (so drbdadm \
                 secondary can run) and makes them standby"
    )]
    SetRole {
        /// The `[[device]]` with `drbd_minor`.
        device: String,
        /// primary or secondary.
        role: RoleArg,
    },
    /// Saves the running configuration (to the file it was loaded from
    /// when `path` is absent).
    #[command(
        about = "Save the running configuration (to the file srptd was started from \
                 when no path is given)"
    )]
    WriteConfig {
        /// Where to write (default: srptd's configuration file).
        path: Option<PathBuf>,
    },
    /// Re-reads the configuration file and applies what changed in
    /// devices, LUN maps, groups and `enabled`, without dropping sessions.
    #[command(about = "Re-read srptd's configuration file and apply it (as SIGHUP does)")]
    Reload,
    /// Changes the log threshold while running (SCST's `trace_level`).
    #[command(skip)]
    SetLogLevel { level: crate::log::Level },
}

impl Request {
    /// The event a successful request is logged as, and whether it
    /// changed anything (queries are logged at debug level).
    pub(super) fn event(&self) -> (&'static str, bool) {
        match self {
            Request::Show
            | Request::Sessions
            | Request::Devices
            | Request::Luns
            | Request::TargetGroups
            | Request::Roles => ("admin_query", false),
            Request::SetRole { .. } => ("role_set", true),
            Request::SetGroupState { .. } => ("group_state_set", true),
            Request::AddDevice { .. } => ("device_added", true),
            Request::RemoveDevice { .. } => ("device_removed", true),
            Request::Resize { .. } => ("device_resized", true),
            Request::ChangeMedium { .. } => ("medium_changed", true),
            Request::AddLun { .. } => ("lun_added", true),
            Request::RemoveLun { .. } => ("lun_removed", true),
            Request::AddGroup { .. } => ("group_added", true),
            Request::RemoveGroup { .. } => ("group_removed", true),
            Request::AddInitiator { .. } => ("initiator_added", true),
            Request::RemoveInitiator { .. } => ("initiator_removed", true),
            Request::Enable { .. } => ("target_enabled", true),
            Request::Disable { .. } => ("target_disabled", true),
            Request::WriteConfig { .. } => ("config_written", true),
            Request::Reload => ("reloaded", true),
            Request::SetLogLevel { .. } => ("log_level_set", true),
        }
    }
}

/// An asymmetric access state on the command line and in the request's
/// JSON, as its word (`standby`): a misspelt one is refused by `srptadm`
/// before the daemon is asked, and by the daemon when the JSON came
/// from elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateArg(pub scsi::AccessState);

impl std::str::FromStr for StateArg {
    type Err = scsi::alua::UnknownState;
    fn from_str(s: &str) -> Result<StateArg, Self::Err> {
        s.parse().map(StateArg)
    }
}

impl Serialize for StateArg {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0.name())
    }
}

impl<'de> Deserialize<'de> for StateArg {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<StateArg, D::Error> {
        let w = String::deserialize(d)?;
        w.parse().map_err(serde::de::Error::custom)
    }
}

/// A request's arguments for a log line: its JSON without `cmd`.
/// What a change request did, in words, from the daemon's answer `v`
/// (`srptadm` prints it; the daemon logs it); `None` for the queries,
/// whose answers are tables.
pub fn answer_text(req: &Request, v: &Value) -> Option<String> {
    let s = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let size = |v: &Value| rdma_types::units::format_size(v.as_u64().unwrap_or(0));
    let set = |g: &Value| match g.as_str() {
        Some(g) => format!("group {g}"),
        None => "the default LUNs".to_string(),
    };
    let told = |v: &Value| match v["aer_sent"].as_u64().unwrap_or(0) {
        0 => "no session to tell".to_string(),
        1 => "1 session told (unit attention and SRP_AER_REQ)".to_string(),
        n => format!("{n} sessions told (unit attention and SRP_AER_REQ)"),
    };
    Some(match req {
        Request::Show
        | Request::Sessions
        | Request::Devices
        | Request::Luns
        | Request::TargetGroups
        | Request::Roles => return None,
        Request::SetRole { .. } if v["open"] == v["was_open"] => format!(
            "device {} follows {} already; nothing changed",
            s(&v["device"]),
            s(&v["role"])
        ),
        Request::SetRole { .. } if v["open"] == Value::Bool(true) => format!(
            "device {} (DRBD minor {}): primary; opened, its target port groups active; every \
             session gets ASYMMETRIC ACCESS STATE CHANGED",
            s(&v["device"]),
            s(&v["minor"])
        ),
        Request::SetRole { .. } => format!(
            "device {} (DRBD minor {}): secondary; in-flight commands done, closed (drbdadm \
             secondary may run), its target port groups standby",
            s(&v["device"]),
            s(&v["minor"])
        ),
        Request::SetGroupState { .. } if v["state"] == v["was"] => format!(
            "target port group {} ({}) is {} already; nothing changed",
            s(&v["group"]),
            s(&v["group_id"]),
            s(&v["state"])
        ),
        Request::SetGroupState { .. } => format!(
            "target port group {} ({}): {} -> {}; every session gets ASYMMETRIC ACCESS STATE \
             CHANGED",
            s(&v["group"]),
            s(&v["group_id"]),
            s(&v["was"]),
            s(&v["state"])
        ),
        Request::AddDevice { .. } => {
            format!("added device {} ({})", s(&v["added"]), size(&v["size"]))
        }
        Request::RemoveDevice { .. } => format!("removed device {}", s(&v["removed"])),
        Request::Resize { .. } if v["size"] == v["was"] => format!(
            "device {} is {} already; nothing changed",
            s(&v["device"]),
            size(&v["size"])
        ),
        Request::Resize { .. } => format!(
            "resized device {} from {} to {}; {}",
            s(&v["device"]),
            size(&v["was"]),
            size(&v["size"]),
            told(v)
        ),
        Request::ChangeMedium { .. } => match v["image"].as_str() {
            Some(i) => format!(
                "device {}: disc {i} ({}) in; every session that sees it gets 28/00",
                s(&v["device"]),
                size(&v["size"])
            ),
            None => format!(
                "device {}: no disc; every session that sees it gets 28/00",
                s(&v["device"])
            ),
        },
        Request::AddLun { .. } => format!(
            "added LUN {} ({}, {}) to {}; {}",
            s(&v["lun"]),
            s(&v["device"]),
            size(&v["size"]),
            set(&v["group"]),
            told(v)
        ),
        Request::RemoveLun { .. } => format!(
            "removed LUN {} ({}) from {}; {}",
            s(&v["removed_lun"]),
            s(&v["device"]),
            set(&v["group"]),
            told(v)
        ),
        Request::AddGroup { .. } => format!("added group {}", s(&v["added"])),
        Request::RemoveGroup { .. } => format!(
            "removed group {}; its initiators see the default LUNs",
            s(&v["removed"])
        ),
        Request::AddInitiator { .. } => format!(
            "added initiator {} to group {}",
            s(&v["added"]),
            s(&v["group"])
        ),
        Request::RemoveInitiator { .. } => format!(
            "removed initiator {} from group {}",
            s(&v["removed"]),
            s(&v["group"])
        ),
        Request::Enable { .. } | Request::Disable { .. } => {
            let names: Vec<String> = v["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(s)
                .collect();
            let what = if v["enabled"] == Value::Bool(true) {
                "enabled (accepting logins)"
            } else {
                "disabled (refusing logins; its initiators are logged out)"
            };
            format!("target {} {what}", names.join(", "))
        }
        Request::WriteConfig { .. } => {
            format!("wrote the running configuration to {}", s(&v["written"]))
        }
        Request::SetLogLevel { .. } => {
            format!("log level {} (was {})", s(&v["log_level"]), s(&v["was"]))
        }
        Request::Reload => {
            let n = v["lun_map_changes"].as_u64().unwrap_or(0);
            let resized: Vec<String> = v["resized"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| {
                    format!(
                        ", device {} grown from {} to {}",
                        s(&r["device"]),
                        size(&r["was"]),
                        size(&r["size"])
                    )
                })
                .collect();
            let mut t = format!(
                "reloaded the configuration: {n} LUN map change{}{}, {}",
                if n == 1 { "" } else { "s" },
                resized.concat(),
                told(v)
            );
            let restart: Vec<String> = v["needs_restart"]
                .as_array()
                .into_iter()
                .flatten()
                .map(s)
                .collect();
            if v["alua_changed"] == Value::Bool(true) {
                t += "; target port groups changed (every session gets ASYMMETRIC ACCESS STATE \
                      CHANGED)";
            }
            if !restart.is_empty() {
                t += &format!("; not applied until srptd restarts: {}", restart.join("; "));
            }
            t
        }
    })
}

pub(super) fn args_of(asked: &Value) -> String {
    match asked {
        Value::Object(m) => {
            let mut m = m.clone();
            m.remove("cmd");
            Value::Object(m).to_string()
        }
        v => v.to_string(),
    }
}

/// Serves srptd's control socket ([`daemon_ctl::serve_lines`]): one
/// [`Request`] per line, one answer per line.
pub fn serve_control(daemon: Arc<Daemon>, listener: UnixListener) -> std::thread::JoinHandle<()> {
    serve_lines(listener, "srptd", move |line| {
        match serde_json::from_str::<Request>(line) {
            Ok(req) => match daemon.handle(req) {
                Ok(data) => json!({ "ok": true, "data": data }),
                Err(e) => json!({ "ok": false, "error": e.to_string() }),
            },
            Err(e) => json!({ "ok": false, "error": format!("bad request: {e}") }),
        }
    })
}

/// Serves `GET /metrics` in the Prometheus text format on `addr`.
pub fn serve_metrics(
    daemon: Arc<Daemon>,
    addr: std::net::SocketAddr,
) -> std::io::Result<(std::net::SocketAddr, std::thread::JoinHandle<()>)> {
    use std::io::Read;
    let l = std::net::TcpListener::bind(addr)?;
    let local = l.local_addr()?;
    let t = std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut c) = conn else { continue };
            let _ = c.set_read_timeout(Some(std::time::Duration::from_secs(2)));
            let mut buf = [0u8; 2048];
            let n = c.read(&mut buf).unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]);
            let (status, body) = if req.starts_with("GET /metrics ") {
                ("200 OK", daemon.metrics())
            } else {
                ("404 Not Found", "try /metrics\n".to_string())
            };
            let _ = write!(
                c,
                "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    Ok((local, t))
}

/// A client of the control socket (what `srptadm` uses).
pub fn request(path: &Path, req: &Request) -> Result<Value, RequestError> {
    request_to(path, "srptd", req)
}
