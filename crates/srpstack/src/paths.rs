//! Paths to a target and the LUNs opened over them, as the `srp` command
//! line uses them: each LUN survives its connection (the remote port state
//! machine reconnects it) and, given several paths, is one multipath
//! device.
//!
//! A [`PathLogin`] is one path (a local NIC and a way to reach the target
//! port). All LUNs opened over a path share its session, as they share an
//! `ib_srp` SCSI host: a second login of the same initiator port would be
//! a SINGLE-channel login that ends the first. When the session fails, the
//! first LUN to reconnect logs in again and the others take the new
//! session.

use rdma_types::Guid;
use srp_initiator::disk::Disk;
use srp_initiator::multipath::{Multipath, PathDevice, Policy};
use srp_initiator::remote::RemoteDisk;
use srp_initiator::rport::RportConfig;
use srp_initiator::session::{Connector, Session, SessionConfig};
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
    current: Mutex<Option<Arc<Session>>>,
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
            current: Mutex::new(None),
        }
    }

    /// The live session of this path, logging in when there is none or
    /// the last one ended.
    ///
    /// # Errors
    /// The login failed (reason in words).
    pub fn session(&self) -> io::Result<Arc<Session>> {
        let mut cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = cur.as_ref().filter(|s| !s.is_closed()) {
            return Ok(s.clone());
        }
        let s = Session::connect(
            self.provider.clone(),
            self.guid,
            self.connector.clone(),
            self.config.clone(),
        )
        .map_err(|e| io::Error::other(format!("login: {e}")))?;
        let s = Arc::new(s);
        *cur = Some(s.clone());
        Ok(s)
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
        let open = Box::new(move || Disk::open(p.session()?, lun));
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
