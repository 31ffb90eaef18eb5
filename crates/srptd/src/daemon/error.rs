//! Why an admin request (`srptadm`, SIGHUP) was refused: the words the
//! user reads, naming what to do where the user can act.

use crate::config::{ConfigError, InitiatorError, SizeError};
use std::path::PathBuf;

use super::LunNumberError;

/// Why [`super::Daemon::handle`] refused a request; nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// A reload changed a device that a LUN maps before or after.
    #[error("reload refused: device `{0}` changed while mapped; unmap it first or restart srptd")]
    ChangedWhileMapped(String),
    /// The reloaded file, or a device it opens, names file, line and key.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The running configuration as the request would leave it is
    /// invalid (it came in the request: no file, no line).
    #[error("{}: {}", .0.key, .0.message)]
    Invalid(#[source] ConfigError),
    /// `add-device` got a table that is not a `[[device]]`.
    #[error("device: {}", .0.message().trim())]
    DeviceToml(#[source] toml::de::Error),
    /// `add-device`: the device cannot be opened; `key` is at fault.
    #[error("{key}: {message}")]
    Device { key: &'static str, message: String },
    #[error("no device `{0}`")]
    NoDevice(String),
    #[error("device `{device}` is mapped at default LUN {lun}; remove the LUN first")]
    MappedAtDefault { device: String, lun: u32 },
    #[error("device `{device}` is mapped at LUN {lun} of group `{group}`; remove the LUN first")]
    MappedInGroup {
        device: String,
        lun: u32,
        group: String,
    },
    /// `resize`: the size given cannot be read.
    #[error(transparent)]
    Size(#[from] SizeError),
    #[error(
        "device `{device}`: size {bytes} is not a positive multiple of its block size {block_size}"
    )]
    NotBlockMultiple {
        device: String,
        bytes: u64,
        block_size: u64,
    },
    #[error("device `{device}`: shrinking from {was} to {bytes} bytes is refused (data past the new end would be lost); unmap it and add a smaller device")]
    Shrink {
        device: String,
        was: u64,
        bytes: u64,
    },
    #[error("device `{device}`: a {handler} device cannot be resized (only ram devices can)")]
    NotResizable {
        device: String,
        handler: &'static str,
    },
    #[error(
        "device `{device}`: a {handler} device has no disc to change (only vcdrom devices have)"
    )]
    NoMedium {
        device: String,
        handler: &'static str,
    },
    #[error("device `{device}`: {source}")]
    Medium {
        device: String,
        #[source]
        source: scsi::vcdrom::ImageError,
    },
    #[error("device `{0}` is not mapped at any LUN; map it first, or remove it and add it with the new size")]
    NotMapped(String),
    /// The SCSI core could not resize the device.
    #[error("device `{device}`: resize: {source}")]
    Resize {
        device: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Lun(#[from] LunNumberError),
    #[error("no group `{0}`")]
    NoGroup(String),
    #[error("group `{0}` exists")]
    GroupExists(String),
    #[error("group `{group}` has no LUN {lun}")]
    NoLunInGroup { group: String, lun: u32 },
    #[error("no default LUN {0}")]
    NoDefaultLun(u32),
    #[error(transparent)]
    Initiator(#[from] InitiatorError),
    #[error("`{initiator}` is already in group `{group}`")]
    InitiatorInGroup { initiator: String, group: String },
    #[error("`{initiator}` is not in group `{group}`")]
    InitiatorNotInGroup { initiator: String, group: String },
    #[error("no target port group `{group}` (give its name or group_id; the groups are {known})")]
    NoTargetGroup { group: String, known: String },
    #[error("target port group `{group}` follows DRBD device `{device}`: its state is the role's (srptadm set-role {device} primary|secondary)")]
    GroupFollows { group: String, device: String },
    #[error("no DRBD device `{device}` (those with drbd_minor: {known})")]
    NotDrbd { device: String, known: String },
    /// A DRBD device could not be opened or closed.
    #[error(transparent)]
    Role(#[from] super::roles::RoleError),
    /// A reload or add-device would change what follows DRBD.
    #[error("{0} changes only at a restart of srptd")]
    DrbdNeedsRestart(String),
    #[error("no target `{0}` (give its name or address)")]
    NoTarget(String),
    /// `reload` of a daemon started without `--config`.
    #[error("srptd was not started from a configuration file")]
    NoConfigFile,
    /// `write-config` without a path, of a daemon started without one.
    #[error("no file given and srptd was not started from one")]
    NoFileToWrite,
    #[error("write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
