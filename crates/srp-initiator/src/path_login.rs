//! Paths to a target and the LUNs opened over them, as the `srp` command
//! line uses them: each LUN survives its connection (the remote port state
//! machine reconnects it) and, given several paths, is one multipath
//! device.
//!
//! A [`PathLogin`] is one path (a local NIC and a way to reach the target
//! port). All LUNs opened over a path share its session, as they share an
//! `ib_srp` SCSI host: a second login of the same initiator port would be
//! a SINGLE-channel login that ends the first. With `ch_count` > 1 the
//! session is several channels of the nexus (channel 0 SINGLE, the rest
//! MULTI, as ib_srp logs in) and each LUN spreads its I/O over them. When
//! any channel fails, the first LUN to reconnect logs all of them in again
//! and the others take the new channels.

use crate::disk::Disk;
use crate::multipath::{Multipath, PathDevice, Policy};
use crate::remote::RemoteDisk;
use crate::rport::RportConfig;
use crate::session::{Connector, Session, SessionConfig};
use rdma_types::Guid;
use std::io;
use std::sync::{Arc, Mutex};
use verbs::Provider;

/// One path: a local CA and a connector to the target port.
pub struct PathLogin {
    /// For messages: "local -> target".
    pub name: String,
    provider: Arc<dyn Provider>,
    guid: Guid,
    connector: Arc<dyn Connector>,
    config: SessionConfig,
    ch_count: u16,
    /// The channels of the last login. Held only to read or replace
    /// them, never across a login: `srp list` must answer while a
    /// reconnect attempt waits for a target that is gone.
    current: Mutex<Vec<Arc<Session>>>,
    /// Held across a login, so the LUNs of this path log in once.
    login: Mutex<()>,
}

impl PathLogin {
    /// A path that logs in on CA `guid` of `provider` through `connector`.
    pub fn new(
        name: String,
        provider: Arc<dyn Provider>,
        guid: Guid,
        connector: Arc<dyn Connector>,
        config: SessionConfig,
    ) -> PathLogin {
        PathLogin {
            name,
            provider,
            guid,
            connector,
            config,
            ch_count: 1,
            current: Mutex::new(Vec::new()),
            login: Mutex::new(()),
        }
    }

    /// Logs in `n` channels (at least 1) instead of one.
    pub fn with_ch_count(mut self, n: u16) -> PathLogin {
        self.ch_count = n.max(1);
        self
    }

    /// The live channels of this path (channel 0 first), logging all of
    /// them in again when there are none or any has ended.
    ///
    /// # Errors
    /// A login failed (reason in words).
    pub fn channels(&self) -> io::Result<Vec<Arc<Session>>> {
        let _login = self.login.lock().unwrap_or_else(|e| e.into_inner());
        {
            let mut cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
            if !cur.is_empty() && cur.iter().all(|s| !s.is_closed()) {
                return Ok(cur.clone());
            }
            // Channel 0's SINGLE login ends whatever the target still
            // holds of the old channels.
            cur.clear();
        }
        let mut fresh = Vec::new();
        for k in 0..self.ch_count {
            let mut cfg = self.config.clone();
            cfg.channel.channel_index = k;
            let s = Session::connect(
                self.provider.clone(),
                self.guid,
                self.connector.clone(),
                cfg,
            )
            .map_err(|e| {
                io::Error::other(if self.ch_count == 1 {
                    format!("login: {e}")
                } else {
                    format!("login of channel {k}: {e}")
                })
            })?;
            fresh.push(Arc::new(s));
        }
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = fresh.clone();
        Ok(fresh)
    }

    /// The channels of the current login, as they are (none before the
    /// first login; some may have ended), without logging in.
    pub fn live_channels(&self) -> Vec<Arc<Session>> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Channel 0 of this path (see [`PathLogin::channels`]).
    ///
    /// # Errors
    /// A login failed.
    pub fn session(&self) -> io::Result<Arc<Session>> {
        Ok(self.channels()?.remove(0))
    }
}

/// LUN `lun` over `paths`: a reconnecting [`RemoteDisk`] per path and, with
/// more than one path, a [`Multipath`] device over them with `policy`
/// (I/O waits at most `no_path_timeout` for a path).
///
/// # Errors
/// A path cannot log in or open the LUN, or the paths reach different LUs.
pub fn open_lun(
    paths: &[Arc<PathLogin>],
    lun: u16,
    rport: RportConfig,
    policy: Policy,
    no_path_timeout: std::time::Duration,
) -> io::Result<Arc<dyn blockload::BlockDevice>> {
    let mut devs: Vec<(String, Arc<dyn PathDevice>)> = Vec::new();
    for path in paths {
        let p = path.clone();
        let open = Box::new(move || {
            let mut ch = p.channels()?;
            let first = ch.remove(0);
            Ok(Disk::open(first, lun)?.with_channels(ch))
        });
        let d = RemoteDisk::open(open, rport)
            .map_err(|e| io::Error::new(e.kind(), format!("over {}: {e}", path.name)))?;
        devs.push((path.name.clone(), Arc::new(d)));
    }
    if devs.len() == 1 {
        let (_, d) = devs.pop().expect("one path");
        return Ok(d);
    }
    Ok(Arc::new(Multipath::new(devs, policy, no_path_timeout)?))
}
