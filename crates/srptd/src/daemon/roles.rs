//! Devices on DRBD (`drbd_minor`): their stores opened while this host is
//! Primary and closed, after their in-flight commands, when it becomes
//! Secondary, and the target port groups that `follow` them set to match
//! (issue 30 build item 2). The decisions are [`crate::drbd::Follower`]'s;
//! this file reads the status file, opens and closes, and sets states.
//!
//! Order, so that no write is ever served by a Secondary: a promotion
//! opens the store first and then makes the groups active; a demotion
//! makes the groups transitioning (new commands get 04/0A and are
//! retried), closes the store (waiting for the commands already running;
//! any that reach it later get 04/0B) and then makes the groups standby.
//! Each state change gives every session ASYMMETRIC ACCESS STATE CHANGED.

use super::*;
use crate::drbd::{Action, Follower, Role};
use scsi::AccessState;

/// One device that follows a DRBD role.
pub(super) struct Followed {
    pub(super) name: String,
    pub(super) minor: u32,
    pub(super) section: DeviceSection,
    pub(super) store: Arc<scsi::Detachable>,
    /// Target port groups following it: group_id, and whether its ports
    /// are this host's (else the peer's, which take the opposite state).
    pub(super) groups: Vec<(u16, bool)>,
    /// The follower, and the last error logged (not repeated every poll).
    /// Held while the store opens or closes: the poller and `set-role`
    /// take turns.
    pub(super) state: Mutex<(Follower, Option<RoleError>)>,
}

/// Where a followed store is: what the groups say.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Open,
    Closing,
    Closed,
}

/// Why a followed device's store could not be opened or closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoleError {
    /// The device did not open (a Secondary's DRBD device never does).
    #[error(
        "device {device} (DRBD minor {minor}): {key}: {message}; DRBD opens a device only on \
         its Primary: make this host Primary first (drbdadm primary RESOURCE)"
    )]
    Open {
        device: String,
        minor: u32,
        key: &'static str,
        message: String,
    },
    /// It opened with another size than the logical unit's.
    #[error("device {device}: {source}")]
    Size {
        device: String,
        #[source]
        source: scsi::detach::SizeChanged,
    },
    /// Commands were still running at the end of `drain_ms`.
    #[error(
        "device {device} (DRBD minor {minor}): {source}; it takes no new command and is \
         closed when they end (try set-role again)"
    )]
    Drain {
        device: String,
        minor: u32,
        #[source]
        source: scsi::detach::StillRunning,
    },
}

/// A role `srptadm set-role` gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum RoleArg {
    Primary,
    Secondary,
}

/// Size and logical block size of a DRBD device's store without
/// opening it (a Secondary's cannot be opened): from sysfs for a block
/// device, from the file's length for a file (tests).
pub(super) fn drbd_geometry(d: &DeviceSection) -> Result<(u64, u32), DeviceError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let file = d.filename.as_ref().ok_or_else(|| {
        (
            d.handler.span(),
            "filename",
            "a DRBD device needs filename = \"/dev/drbdN\"".to_string(),
        )
    })?;
    let path = file.get_ref();
    let bad = |m: String| (file.span(), "filename", m);
    let meta = std::fs::metadata(path).map_err(|e| {
        bad(format!(
            "{}: {e}: is the DRBD resource up (drbdadm up RESOURCE)?",
            path.display()
        ))
    })?;
    let bs = *d.block_size.get_ref();
    let (size, lbs) = if meta.file_type().is_block_device() {
        let (maj, min) = (libc::major(meta.rdev()), libc::minor(meta.rdev()));
        let sys = PathBuf::from(format!("/sys/dev/block/{maj}:{min}"));
        let read = |rel: &str| -> Option<u64> {
            std::fs::read_to_string(sys.join(rel))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        let sectors = read("size").ok_or_else(|| {
            bad(format!(
                "cannot read the size of {} from {}",
                path.display(),
                sys.join("size").display()
            ))
        })?;
        (
            sectors * 512,
            read("queue/logical_block_size").unwrap_or(512) as u32,
        )
    } else if meta.file_type().is_file() {
        (meta.len(), bs)
    } else {
        return Err(bad(format!(
            "{} is not a block device or a file",
            path.display()
        )));
    };
    if size == 0 || size % bs as u64 != 0 {
        return Err(bad(format!(
            "{} holds {size} bytes, not a positive multiple of block_size {bs}: is the DRBD \
             resource up and attached (drbdadm up RESOURCE)?",
            path.display()
        )));
    }
    Ok((size, lbs))
}

/// The status file's text; a missing or unreadable one says nothing
/// (every minor [`Role::Unknown`]).
fn read_status(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

impl Daemon {
    /// The followed device's groups set for `phase`.
    fn set_phase(&self, f: &Followed, phase: Phase) {
        for &(id, local) in &f.groups {
            let state = match (phase, local) {
                (Phase::Open, true) => AccessState::ActiveOptimized,
                (Phase::Closing, true) => AccessState::Transitioning,
                (Phase::Closed, true) => AccessState::Standby,
                (Phase::Open, false) | (Phase::Closing, false) => AccessState::Standby,
                (Phase::Closed, false) => AccessState::ActiveOptimized,
            };
            if let Ok(was) = self.scsi.set_group_state(id, state) {
                if was != state {
                    tracing::info!(device = %f.name, group_id = id, %was, %state, "target port group follows DRBD");
                }
            }
        }
    }

    /// Does what `f`'s follower wants now (`st` is its locked state).
    /// Returns what was done.
    ///
    /// # Errors
    /// Why the store could not be opened or closed; the follower keeps
    /// wanting it, so the next poll tries again.
    fn drive(
        &self,
        f: &Followed,
        st: &mut (Follower, Option<RoleError>),
    ) -> Result<Option<Action>, RoleError> {
        let Some(action) = st.0.next() else {
            return Ok(None);
        };
        let r = match action {
            Action::Open => self.open_followed(f),
            Action::Close => self.close_followed(f),
        };
        match &r {
            Ok(()) => {
                st.0.done(action == Action::Open);
                st.1 = None;
                self.log.emit(crate::log::Record::info(
                    "drbd_role",
                    format!(
                        "device {} (DRBD minor {}): {}",
                        f.name,
                        f.minor,
                        match action {
                            Action::Open => "Primary here: opened, its target port groups active",
                            Action::Close => "Secondary here: in-flight commands done, closed, its target port groups standby",
                        }
                    ),
                ));
            }
            Err(e) if st.1.as_ref() != Some(e) => {
                self.log
                    .emit(crate::log::Record::warn("drbd_role_failed", e.to_string()));
                st.1 = Some(e.clone());
            }
            Err(_) => {}
        }
        r.map(|()| Some(action))
    }

    fn open_followed(&self, f: &Followed) -> Result<(), RoleError> {
        let store = open_store(&f.section, false).map_err(|(_, key, message)| RoleError::Open {
            device: f.name.clone(),
            minor: f.minor,
            key,
            message,
        })?;
        f.store
            .open_with(store.backend)
            .map_err(|source| RoleError::Size {
                device: f.name.clone(),
                source,
            })?;
        self.set_phase(f, Phase::Open);
        Ok(())
    }

    fn close_followed(&self, f: &Followed) -> Result<(), RoleError> {
        self.set_phase(f, Phase::Closing);
        let drain = Duration::from_millis(*lock(&self.cfg).drbd.drain_ms.get_ref());
        f.store.close(drain).map_err(|source| RoleError::Drain {
            device: f.name.clone(),
            minor: f.minor,
            source,
        })?;
        self.set_phase(f, Phase::Closed);
        Ok(())
    }

    /// Reads the status file once and follows every change it shows.
    pub(super) fn poll_roles(&self) {
        if self.drbd.is_empty() {
            return;
        }
        let path = lock(&self.cfg).drbd.status_file.clone();
        let text = read_status(&path);
        for f in &self.drbd {
            let mut st = lock(&f.state);
            st.0.observe(crate::drbd::role_of(&text, f.minor));
            let _ = self.drive(f, &mut st);
        }
    }

    /// The first reading at start: groups as for a closed store, then
    /// whatever the status file says (a Primary opens at once).
    pub(super) fn start_roles(&self) {
        for f in &self.drbd {
            self.set_phase(f, Phase::Closed);
        }
        self.poll_roles();
    }

    /// `srptadm set-role`: this host is (or is about to be) `role` for
    /// the DRBD device `device`. `primary` opens it and makes its groups
    /// active; `secondary` returns once it is closed.
    pub(super) fn set_role(&self, device: &str, role: RoleArg) -> Result<Value, AdminError> {
        let f = self
            .drbd
            .iter()
            .find(|f| f.name == device)
            .ok_or_else(|| AdminError::NotDrbd {
                device: device.to_string(),
                known: self.drbd_names(),
            })?;
        let mut st = lock(&f.state);
        let was_open = st.0.is_open();
        st.0.tell(match role {
            RoleArg::Primary => Role::Primary,
            RoleArg::Secondary => Role::Secondary,
        });
        self.drive(f, &mut st).map_err(AdminError::Role)?;
        Ok(json!({
            "device": f.name,
            "minor": f.minor,
            "role": role,
            "open": st.0.is_open(),
            "was_open": was_open,
        }))
    }

    /// `srptadm roles`: every DRBD device, what the file says, the role
    /// followed, open or not.
    pub(super) fn roles(&self) -> Value {
        let devices: Vec<Value> = self
            .drbd
            .iter()
            .map(|f| {
                let st = lock(&f.state);
                json!({
                    "device": f.name,
                    "minor": f.minor,
                    "status_file_says": st.0.seen().map(Role::name),
                    "following": st.0.wanted().name(),
                    "open": st.0.is_open(),
                    "groups": f.groups.iter().map(|g| g.0).collect::<Vec<_>>(),
                    "error": st.1.as_ref().map(|e| e.to_string()),
                })
            })
            .collect();
        json!({ "devices": devices })
    }

    fn drbd_names(&self) -> String {
        let n: Vec<&str> = self.drbd.iter().map(|f| f.name.as_str()).collect();
        if n.is_empty() {
            "none: give a [[device]] drbd_minor".into()
        } else {
            n.join(", ")
        }
    }

    /// The group `id` follows a DRBD device: its name.
    pub(super) fn group_follows(&self, id: u16) -> Option<&str> {
        self.drbd
            .iter()
            .find(|f| f.groups.iter().any(|g| g.0 == id))
            .map(|f| f.name.as_str())
    }
}

/// Polls the roles every `every` until `stop`; sleeps in steps of at
/// most 100 ms so a stop is seen soon.
pub(super) fn watch_roles(
    daemon: std::sync::Weak<Daemon>,
    every: Duration,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    use std::sync::atomic::Ordering;
    loop {
        let mut left = every;
        while !left.is_zero() {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let step = left.min(Duration::from_millis(100));
            std::thread::sleep(step);
            left -= step;
        }
        let Some(d) = daemon.upgrade() else { return };
        if stop.load(Ordering::Relaxed) {
            return;
        }
        d.poll_roles();
    }
}
