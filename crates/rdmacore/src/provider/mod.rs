//! The provider: verbs objects in one handle table, each holding its
//! libibverbs object; one event thread per opened CA.

mod ca;
mod cq;
mod events;
mod gsi;
mod mr;
mod mw;
mod objects;
mod post;
mod qp;

use crate::sys::{self, loader::Verbs, LoadError};
pub use gsi::NO_SA_ON_ROCE;
use objects::State;
use rdma_types::{AccessFlags, Guid, PortNum, Qpn, Rkey};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use verbs::{
    AhAttr, AhHandle, CaAttr, CaHandle, Context, CqHandle, CqInit, EventHandler, MemBuf, MrHandle,
    MrInfo, MwBind, MwHandle, MwType, PdHandle, PortAttr, Provider, QpAttr, QpHandle, QpInit,
    RecvWr, Result, SendWr, SrqAttr, SrqHandle, VerbsError, WorkCompletion,
};

/// How the provider is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The library to load: a SONAME found the way `dlopen` finds it, or
    /// a path (default [`crate::LIBIBVERBS`]).
    pub library: String,
    /// The device GID index every port shows as its GID 0 (see the crate
    /// docs); `None`: the one rdma-core's tools would choose.
    pub gid_index: Option<u32>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            library: sys::LIBIBVERBS.to_string(),
            gid_index: None,
        }
    }
}

/// A device as libibverbs lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The kernel's name (`rxe0`, `mlx5_0`).
    pub name: String,
    /// Node GUID: what [`Provider::open_ca`] takes.
    pub guid: Guid,
}

/// Why a device name found no device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceLookupError {
    /// No device of that name.
    #[error("no RDMA device named {name} (rdma-core lists: {})", list_or_none(.known))]
    NoSuchDevice {
        /// The name asked for.
        name: String,
        /// The devices there are.
        known: Vec<String>,
    },
    /// The kernel has no RDMA here (`ibv_get_device_list` says `ENOSYS`:
    /// no `ib_uverbs`, no `/sys/class/infiniband_verbs`).
    #[error(
        "no RDMA in this kernel (ibv_get_device_list: {0}): load ib_uverbs and a device's driver"
    )]
    NoKernelSupport(String),
    /// libibverbs could not list its devices.
    #[error("cannot list RDMA devices: {0}")]
    List(String),
    /// The device has no such port.
    #[error("{name} has no port {port} (it has {ports}, numbered from 1)")]
    NoSuchPort {
        /// The device.
        name: String,
        /// The port asked for.
        port: u8,
        /// How many it has.
        ports: u8,
    },
    /// The port is not ACTIVE (the message says what to do).
    #[error("{0}")]
    PortNotActive(crate::PortDown),
    /// The device could not be opened or its port queried.
    #[error("cannot query {name}: {reason}")]
    Query {
        /// The device.
        name: String,
        /// The device's errno in words.
        reason: String,
    },
}

fn list_or_none(names: &[String]) -> String {
    if names.is_empty() {
        "none; is the driver loaded (modprobe rdma_rxe; rdma link add) and ibverbs-providers installed?".into()
    } else {
        names.join(", ")
    }
}

/// The rdma-core provider (see the crate docs).
pub struct RdmaCore {
    verbs: Arc<Verbs>,
    opts: Options,
    st: Arc<Mutex<State>>,
    /// The next key handed to the device as an object's context.
    next_key: AtomicU64,
}

impl RdmaCore {
    /// The provider over the system's libibverbs.
    ///
    /// # Errors
    /// The library is missing or too old, in one line naming the package
    /// to install.
    pub fn new() -> std::result::Result<Arc<RdmaCore>, LoadError> {
        RdmaCore::with_options(Options::default())
    }

    /// The provider with `opts`.
    ///
    /// # Errors
    /// As [`RdmaCore::new`].
    pub fn with_options(opts: Options) -> std::result::Result<Arc<RdmaCore>, LoadError> {
        let verbs = Arc::new(Verbs::load(&opts.library)?);
        Ok(Arc::new(RdmaCore {
            verbs,
            opts,
            st: Arc::new(Mutex::new(State::default())),
            next_key: AtomicU64::new(1),
        }))
    }

    /// The loaded libibverbs, for the RDMA CM service (`crate::cm`).
    pub(crate) fn verbs(&self) -> Arc<Verbs> {
        self.verbs.clone()
    }

    /// The library loaded.
    pub fn library(&self) -> &str {
        &self.verbs.library
    }

    /// The devices libibverbs finds (those whose kernel driver is loaded
    /// and whose user-space driver, `ibverbs-providers`, is installed).
    ///
    /// # Errors
    /// libibverbs could not list them (no `/sys/class/infiniband_verbs`).
    pub fn devices(&self) -> std::result::Result<Vec<DeviceInfo>, DeviceLookupError> {
        sys::devices(&self.verbs)
            .map(|l| {
                l.into_iter()
                    .map(|d| DeviceInfo {
                        name: d.name,
                        guid: Guid(d.guid),
                    })
                    .collect()
            })
            .map_err(|e| match e.0 {
                libc::ENOSYS => DeviceLookupError::NoKernelSupport(e.to_string()),
                _ => DeviceLookupError::List(e.to_string()),
            })
    }

    /// The GUID of the device named `name` (`rxe0`), for `open_ca`.
    ///
    /// # Errors
    /// No such device (the message lists those there are), or no list.
    pub fn guid_of(&self, name: &str) -> std::result::Result<Guid, DeviceLookupError> {
        let devs = self.devices()?;
        devs.iter()
            .find(|d| d.name == name)
            .map(|d| d.guid)
            .ok_or_else(|| DeviceLookupError::NoSuchDevice {
                name: name.to_string(),
                known: devs.into_iter().map(|d| d.name).collect(),
            })
    }

    /// The GUID of the device `spec` names, once its port is there and
    /// ACTIVE: what a tool opening `--device NAME[:PORT]` calls before
    /// `open_ca`, so a port it cannot use is refused up front, saying
    /// why and what to do (see [`crate::PortDown`]).
    ///
    /// # Errors
    /// No such device or port, the port not ACTIVE, or the device could
    /// not be queried.
    pub fn find_port(
        &self,
        spec: &crate::DeviceSpec,
    ) -> std::result::Result<Guid, DeviceLookupError> {
        let guid = self.guid_of(&spec.name)?;
        let query = |e: sys::Errno| DeviceLookupError::Query {
            name: spec.name.clone(),
            reason: e.to_string(),
        };
        let dev = match sys::Device::open(&self.verbs, guid.0) {
            Ok(Some(d)) => d,
            // Gone since it was listed.
            Ok(None) => {
                return Err(DeviceLookupError::NoSuchDevice {
                    name: spec.name.clone(),
                    known: self.devices()?.into_iter().map(|d| d.name).collect(),
                })
            }
            Err(e) => return Err(query(e)),
        };
        let ports = dev.query_device().map_err(query)?.phys_port_cnt;
        if spec.port == 0 || spec.port > ports {
            return Err(DeviceLookupError::NoSuchPort {
                name: spec.name.clone(),
                port: spec.port,
                ports,
            });
        }
        let attr = dev.query_port(spec.port).map_err(query)?;
        if !matches!(
            attr.state,
            sys::raw::IBV_PORT_ACTIVE | sys::raw::IBV_PORT_ACTIVE_DEFER
        ) {
            let root = std::path::Path::new(crate::port::SYSFS);
            let netdev = crate::port::netdev(root, &spec.name, spec.port);
            return Err(DeviceLookupError::PortNotActive(crate::PortDown::new(
                &spec.name, spec.port, &attr, netdev,
            )));
        }
        Ok(guid)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.st)
    }

    fn key(&self) -> u64 {
        self.next_key.fetch_add(1, Ordering::Relaxed)
    }
}

/// The state, even after a panic elsewhere poisoned its lock (each verb
/// leaves the table consistent before it can panic).
fn lock(st: &Mutex<State>) -> MutexGuard<'_, State> {
    st.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for RdmaCore {
    fn drop(&mut self) {
        // Event threads of CAs never closed stop with the provider.
        let st = self.lock();
        for (_, o) in st.objs.iter() {
            if let objects::Obj::Ca { rt, .. } = o {
                rt.stop();
            }
        }
    }
}

fn bad(msg: impl Into<String>) -> VerbsError {
    VerbsError::InvalidArgument(msg.into())
}

/// Each verb but a few one-liners is the inherent method of the same name
/// in the file of its object (`ca`, `cq`, `qp`, `mr`, `mw`, `post`).
impl Provider for RdmaCore {
    fn name(&self) -> &'static str {
        "rdmacore"
    }

    fn list_cas(&self) -> Vec<Guid> {
        self.devices()
            .map(|l| l.into_iter().map(|d| d.guid).collect())
            .unwrap_or_default()
    }

    fn open_ca(
        &self,
        guid: Guid,
        ctx: Context,
        handler: Arc<dyn EventHandler>,
    ) -> Result<CaHandle> {
        RdmaCore::open_ca(self, guid, ctx, handler)
    }
    fn query_ca(&self, ca: CaHandle) -> Result<CaAttr> {
        RdmaCore::query_ca(self, ca)
    }
    fn close_ca(&self, ca: CaHandle) -> Result<()> {
        RdmaCore::close_ca(self, ca)
    }
    fn query_port(&self, ca: CaHandle, port: PortNum) -> Result<PortAttr> {
        RdmaCore::query_port(self, ca, port)
    }
    fn alloc_pd(&self, ca: CaHandle, ctx: Context) -> Result<PdHandle> {
        RdmaCore::alloc_pd(self, ca, ctx)
    }
    fn dealloc_pd(&self, pd: PdHandle) -> Result<()> {
        RdmaCore::dealloc_pd(self, pd)
    }
    fn create_cq(&self, pd: PdHandle, init: &CqInit, ctx: Context) -> Result<CqHandle> {
        RdmaCore::create_cq(self, pd, init, ctx)
    }
    fn destroy_cq(&self, cq: CqHandle) -> Result<()> {
        RdmaCore::destroy_cq(self, cq)
    }
    fn poll_cq(&self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize> {
        RdmaCore::poll_cq(self, cq, out)
    }
    fn req_notify_cq(&self, cq: CqHandle, solicited_only: bool) -> Result<()> {
        RdmaCore::req_notify_cq(self, cq, solicited_only)
    }
    fn wait_cq(&self, cq: CqHandle, timeout: std::time::Duration) -> Result<()> {
        RdmaCore::wait_cq(self, cq, timeout)
    }
    fn create_srq(&self, pd: PdHandle, attr: &SrqAttr, ctx: Context) -> Result<SrqHandle> {
        RdmaCore::create_srq(self, pd, attr, ctx)
    }
    fn modify_srq(&self, srq: SrqHandle, limit: u32) -> Result<()> {
        RdmaCore::modify_srq(self, srq, limit)
    }
    fn query_srq(&self, srq: SrqHandle) -> Result<SrqAttr> {
        RdmaCore::query_srq(self, srq)
    }
    fn destroy_srq(&self, srq: SrqHandle) -> Result<()> {
        RdmaCore::destroy_srq(self, srq)
    }
    fn create_qp(&self, pd: PdHandle, init: &QpInit, ctx: Context) -> Result<QpHandle> {
        RdmaCore::create_qp(self, pd, init, ctx)
    }
    fn qp_num(&self, qp: QpHandle) -> Result<Qpn> {
        RdmaCore::qp_num(self, qp)
    }
    fn modify_qp(&self, qp: QpHandle, attr: &QpAttr) -> Result<()> {
        RdmaCore::modify_qp(self, qp, attr)
    }
    fn query_qp(&self, qp: QpHandle) -> Result<QpAttr> {
        RdmaCore::query_qp(self, qp)
    }
    fn destroy_qp(&self, qp: QpHandle) -> Result<()> {
        RdmaCore::destroy_qp(self, qp)
    }
    fn create_ah(&self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle> {
        RdmaCore::create_ah(self, pd, attr)
    }
    fn destroy_ah(&self, ah: AhHandle) -> Result<()> {
        RdmaCore::destroy_ah(self, ah)
    }
    fn reg_mr(
        &self,
        pd: PdHandle,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
        ctx: Context,
    ) -> Result<MrInfo> {
        RdmaCore::reg_mr(self, pd, buf, addr, len, access, ctx)
    }
    fn rereg_mr(
        &self,
        mr: MrHandle,
        buf: &MemBuf,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<MrInfo> {
        RdmaCore::rereg_mr(self, mr, buf, addr, len, access)
    }
    fn dereg_mr(&self, mr: MrHandle) -> Result<()> {
        RdmaCore::dereg_mr(self, mr)
    }
    fn alloc_mw(&self, pd: PdHandle, kind: MwType, ctx: Context) -> Result<(MwHandle, Rkey)> {
        RdmaCore::alloc_mw(self, pd, kind, ctx)
    }
    fn bind_mw(&self, qp: QpHandle, bind: &MwBind) -> Result<Rkey> {
        RdmaCore::bind_mw(self, qp, bind)
    }
    fn dealloc_mw(&self, mw: MwHandle) -> Result<()> {
        RdmaCore::dealloc_mw(self, mw)
    }
    fn post_send(&self, qp: QpHandle, wrs: &[SendWr]) -> Result<()> {
        // A GSI QP is no device QP: looked for only when the handle is
        // not one, so the data path pays nothing for it.
        match RdmaCore::post_send(self, qp, wrs) {
            Err(VerbsError::InvalidHandle) => match self.gsi_of(qp) {
                Some((g, rt)) => self.gsi_post_send(qp, &g, &rt, wrs),
                None => Err(VerbsError::InvalidHandle),
            },
            r => r,
        }
    }
    fn post_recv(&self, qp: QpHandle, wrs: &[RecvWr]) -> Result<()> {
        match RdmaCore::post_recv(self, qp, wrs) {
            Err(VerbsError::InvalidHandle) => match self.gsi_of(qp) {
                Some((g, _)) => self.gsi_post_recv(qp, &g, wrs),
                None => Err(VerbsError::InvalidHandle),
            },
            r => r,
        }
    }
    fn post_srq_recv(&self, srq: SrqHandle, wrs: &[RecvWr]) -> Result<()> {
        RdmaCore::post_srq_recv(self, srq, wrs)
    }
    /// The kernel owns the device's QP1: serving a class is registering a
    /// kernel agent for it on the GSI QP's user MAD file (see `gsi`); the
    /// CM class stays the kernel CM's.
    fn gsi_register(
        &self,
        qp: QpHandle,
        class: u8,
        version: u8,
        methods: &[u8],
        serve: bool,
    ) -> Result<()> {
        self.gsi_serve(qp, class, version, methods, serve)
    }
    /// Refused: connection requests reach the kernel's CM, which hands
    /// them to RDMA CM (`crate::cm`), never to a GSI QP.
    fn gsi_listen(&self, _qp: QpHandle, _service_id: u64, listen: bool) -> Result<()> {
        if !listen {
            return Ok(());
        }
        Err(VerbsError::NotSupported(
            "IB CM listens on an rdma-core device: the kernel's CM owns them; listen by RDMA CM",
        ))
    }
}
