//! Which NIC a tool runs on: our soft RoCE NIC at an address (the
//! default), or a port of an rdma-core device (`--device NAME[:PORT]`: a
//! real RDMA NIC, or Linux's rxe or siw), through the same verbs.
//!
//! [`Nic::open`] makes the provider, opens the CA and checks the port is
//! ACTIVE; the tools then make their PD, CQ, QP and MR on it as on any
//! provider. [`Nic::rdma_cm`] is RDMA CM on that CA: our own CM agent on
//! the soft NIC's QP1, the kernel's (`rdmacore::RdmaCm`) on an rdma-core
//! device (where the kernel owns QP1), behind one
//! [`rdma_access::rdmacm::Service`].
//!
//! `--iwarp` runs on our soft iWARP NIC at the tool's address
//! (`iwarp_tcp`, RDMA over TCP), RDMA CM being `iwarp_tcp::IwarpCm`.
//!
//! `--nicd` runs on the NIC daemon's soft RoCE NIC at the tool's
//! address instead of one of the tool's own (`nicd::NicdProvider`): many
//! processes on one address, the daemon's QP1 carrying RDMA CM.
//!
//! libibverbs is loaded at run time: without rdma-core installed, the
//! soft NIC works as before and `--device` fails with one line naming
//! the package to install ([`rdmacore::LoadError`]).

use rdma_access::rdmacm::Service;
use rdma_types::{Guid, Mtu, PortNum};
use rdmacore::DeviceSpec;
use std::net::IpAddr;
use std::sync::Arc;
use verbs::{AhAttr, CaHandle, PortAttr, PortState, Provider};

/// What `--device softroce0` names: our soft RoCE NIC, as without
/// `--device` (perftest's `-d` takes a device name; this is ours).
pub const SOFT_DEVICE: &str = "softroce0";

/// How our soft iWARP NIC (`--iwarp`) is named in reports.
pub const IWARP_DEVICE: &str = "softiwarp0";

/// `--device NAME[:PORT]`, the same on every tool of the crate.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct DeviceArgs {
    /// Run on this rdma-core device (a real RDMA NIC, Linux rxe or siw)
    /// instead of our soft RoCE NIC: NAME or NAME:PORT as `ibv_devices`
    /// lists it (port 1 when none is named); `softroce0` is ours. Needs
    /// rdma-core's libibverbs.
    #[arg(
        short = 'd',
        long,
        visible_alias = "ib-dev",
        value_name = "NAME[:PORT]"
    )]
    pub device: Option<DeviceSpec>,
    /// Run on the NIC daemon's soft RoCE NIC at this node's address
    /// through its socket SOCKET [default: $NICD_SOCKET, else nicd's
    /// default]; the default, so other processes can use the address too.
    /// With no daemon there one is started for the address (`nicd`
    /// beside this tool or on PATH); it leaves after $NICD_IDLE_EXIT
    /// (30s) without a client.
    #[arg(
        long,
        value_name = "SOCKET",
        num_args = 0..=1,
        default_missing_value = "", value_parser = nicd::socket_arg,
        conflicts_with_all = ["device", "own_nic"]
    )]
    pub nicd: Option<std::path::PathBuf>,
    /// Run on a soft RoCE NIC of this process's own, not the NIC
    /// daemon's (one process per address and UDP port); also what
    /// $NICD_MODE=own, or an option only such a NIC honours (a UDP port other
    /// than 4791, an MTU other than 4096, faults, a capture, a baseline),
    /// choose.
    #[arg(long, conflicts_with = "device")]
    pub own_nic: bool,
    /// Run on our soft iWARP NIC at this node's address (RDMA over TCP,
    /// what Linux siw speaks) instead of soft RoCE: RDMA CM is a TCP
    /// connection and the MPA exchange; QPs set up by the verbs alone
    /// meet at TCP port 4794 of the peer's address.
    #[arg(long, conflicts_with_all = ["device", "nicd", "own_nic"])]
    pub iwarp: bool,
}

impl DeviceArgs {
    /// The rdma-core device asked for; `None`: our soft RoCE NIC.
    pub fn rdma_core(&self) -> Option<&DeviceSpec> {
        self.device.as_ref().filter(|d| d.name != SOFT_DEVICE)
    }

    /// Whose soft RoCE NIC ([`nicd::choice`]): `None` on an rdma-core
    /// device or iWARP. `own_only` is the first option given that only a
    /// NIC of the tool's own honours.
    ///
    /// # Errors
    /// `$NICD` that does not parse, or contradicting options.
    pub fn which(&self, own_only: Option<String>) -> Result<Option<nicd::choice::Which>, String> {
        if self.rdma_core().is_some() || self.iwarp {
            return Ok(None);
        }
        let asked = nicd::choice::Asked::from_env(self.nicd.as_deref(), self.own_nic, own_only);
        nicd::choice::choose(&asked).map(Some)
    }
}

/// The NIC to open.
#[derive(Debug, Clone)]
pub enum NicChoice {
    /// Our soft RoCE NIC, one CA at `ip` (its GID is the IPv4-mapped
    /// form) sending RoCEv2 from UDP port `udp_port`.
    Soft {
        /// The CA's address.
        ip: IpAddr,
        /// RoCEv2 UDP port (4791 everywhere but in tests).
        udp_port: u16,
        /// The port's MTU.
        mtu: Mtu,
        /// The soft NIC's options (the tools map the environment onto
        /// them: [`rnic::softroce::NicOptions::from_env`]).
        opts: rnic::softroce::NicOptions,
    },
    /// A port of an rdma-core device.
    RdmaCore(DeviceSpec),
    /// Our soft iWARP NIC, one CA at `ip`.
    Iwarp {
        /// The CA's address.
        ip: IpAddr,
        /// The NIC's options.
        opts: iwarp_tcp::NicOptions,
    },
    /// The NIC daemon's soft RoCE NIC at `ip`, through its socket.
    Nicd {
        /// The daemon's socket.
        socket: std::path::PathBuf,
        /// The CA's address.
        ip: IpAddr,
        /// How to start the daemon when none answers (binaries map the
        /// environment onto it: [`nicd::ondemand::OnDemand::from_env`]).
        start: nicd::ondemand::OnDemand,
    },
}

impl NicChoice {
    /// `--device` if it names an rdma-core device, else the soft NIC at
    /// `ip` with the environment's options.
    ///
    /// # Errors
    /// No `ip` for the soft NIC (`what` says which option gives it), or
    /// an environment variable of [`rnic::softroce::NicOptions::from_env`]
    /// that does not parse.
    pub fn from_args(
        dev: &DeviceArgs,
        ip: Option<IpAddr>,
        what: &str,
        udp_port: u16,
        mtu: Mtu,
    ) -> Result<NicChoice, NicError> {
        if let Some(spec) = dev.rdma_core() {
            return Ok(NicChoice::RdmaCore(spec.clone()));
        }
        let ip = ip.ok_or_else(|| NicError::NoAddress(what.to_string()))?;
        if dev.iwarp {
            return Ok(NicChoice::Iwarp {
                ip,
                opts: iwarp_tcp::NicOptions::default(),
            });
        }
        // The path MTU is the QP's (set through the verbs on either NIC).
        let own_only =
            (udp_port != rnic::softroce::ROCE_PORT).then(|| format!("UDP port {udp_port}"));
        match dev.which(own_only).map_err(NicError::Environment)? {
            Some(nicd::choice::Which::Daemon { socket }) => {
                return Ok(NicChoice::Nicd {
                    socket,
                    ip,
                    start: nicd::ondemand::OnDemand::from_env().map_err(NicError::Environment)?,
                })
            }
            Some(own) => {
                let tool = nicd::ondemand::tool_name();
                eprintln!("{}", own.line(&tool, &ip.to_string(), None));
            }
            None => {}
        }
        let opts = rnic::softroce::NicOptions::from_env()
            .map_err(|e| NicError::Environment(e.to_string()))?;
        Ok(NicChoice::Soft {
            ip,
            udp_port,
            mtu,
            opts,
        })
    }
}

/// An RC QP of a tool's own, with its PD, CQ and registered buffer
/// ([`Nic::rc_qp`]).
pub struct RcQp {
    /// The PD.
    pub pd: verbs::PdHandle,
    /// The QP's one CQ (sends and receives).
    pub cq: verbs::CqHandle,
    /// The QP.
    pub qp: verbs::QpHandle,
    /// The buffer.
    pub mem: verbs::MemBuf,
    /// Its registration.
    pub mr: verbs::MrInfo,
}

impl RcQp {
    /// Gives everything back to `p`, children first.
    pub fn release(&self, p: &dyn Provider) {
        let _ = p.destroy_qp(self.qp);
        let _ = p.dereg_mr(self.mr.handle);
        let _ = p.destroy_cq(self.cq);
        let _ = p.dealloc_pd(self.pd);
    }
}

/// Why a NIC could not be opened; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum NicError {
    /// The soft NIC needs an address and none was given.
    #[error(
        "our soft RoCE NIC needs an address: give {0} (or --device NAME for an rdma-core device)"
    )]
    NoAddress(String),
    /// The soft NIC's environment variables.
    #[error("{0}")]
    Environment(String),
    /// libibverbs is missing or unusable (one line naming the package).
    #[error(transparent)]
    Load(#[from] rdmacore::LoadError),
    /// No such device, or no RDMA in this kernel.
    #[error(transparent)]
    Lookup(#[from] rdmacore::DeviceLookupError),
    /// A verb of the setup failed.
    #[error("{what} {device}: {source}")]
    Verbs {
        /// The step.
        what: &'static str,
        /// The device and port.
        device: String,
        /// The provider's error.
        #[source]
        source: verbs::VerbsError,
    },
    /// The port is not ACTIVE.
    #[error(
        "port {port} of {device} is {state:?}, not ACTIVE: is its link up \
         (ip link; rdma link show)?"
    )]
    PortNotActive {
        /// The device.
        device: String,
        /// The port.
        port: u8,
        /// Its state.
        state: PortState,
    },
    /// The NIC daemon is not there, or serves no NIC at the address.
    #[error("{0}")]
    Nicd(String),
    /// RDMA CM could not start on the CA.
    #[error("start RDMA CM on {device}: {reason}")]
    Cm {
        /// The device.
        device: String,
        /// Why.
        reason: String,
    },
}

enum Kind {
    Soft {
        nic: Arc<rnic::softroce::SoftRoce>,
        ip: IpAddr,
    },
    Core(Arc<rdmacore::RdmaCore>),
    Nicd {
        ip: IpAddr,
        /// The QPs in this process (`nicd::Direct`, the default): its
        /// node's counters are ours.
        direct: Option<Arc<nicd::Direct>>,
    },
    Iwarp {
        nic: Arc<iwarp_tcp::SoftIwarp>,
        ip: IpAddr,
    },
}

/// An open CA and port of the chosen NIC.
pub struct Nic {
    p: Arc<dyn Provider>,
    ca: CaHandle,
    guid: Guid,
    port: PortNum,
    attr: PortAttr,
    name: String,
    kind: Kind,
}

impl Nic {
    /// Opens the NIC `choice` names: the CA, and its port, which must be
    /// ACTIVE.
    ///
    /// # Errors
    /// libibverbs missing, no such device, a port that is not ACTIVE, or
    /// a verb that failed.
    pub fn open(choice: &NicChoice) -> Result<Nic, NicError> {
        match choice {
            NicChoice::Soft {
                ip,
                udp_port,
                mtu,
                opts,
            } => {
                let guid = rnic::softroce::ip_guid(*ip);
                let nic = rnic::softroce::SoftRoce::with_options(
                    vec![rnic::softroce::SoftCa { guid, ip: *ip }],
                    *udp_port,
                    *mtu,
                    opts.clone(),
                );
                let p: Arc<dyn Provider> = nic.clone();
                let name = format!("{SOFT_DEVICE} ({ip})");
                Nic::on(p, guid, PortNum(1), name, Kind::Soft { nic, ip: *ip })
            }
            NicChoice::RdmaCore(spec) => Nic::open_rdma_core(spec, rdmacore::Options::default()),
            NicChoice::Iwarp { ip, opts } => {
                let ca = iwarp_tcp::IwarpCa::at(*ip);
                let guid = ca.guid;
                let nic = iwarp_tcp::SoftIwarp::with_options(vec![ca], opts.clone());
                let p: Arc<dyn Provider> = nic.clone();
                let name = format!("{IWARP_DEVICE} ({ip})");
                Nic::on(p, guid, PortNum(1), name, Kind::Iwarp { nic, ip: *ip })
            }
            NicChoice::Nicd { socket, ip, start } => {
                let held = nicd::ondemand::ensure(socket, &[*ip], nicd::Fabric::Roce, start)
                    .map_err(|e| NicError::Nicd(e.to_string()))?;
                if let Some(s) = &held.started {
                    eprintln!("{}: {s}", nicd::ondemand::tool_name());
                }
                let (p, guid) = nicd::connect_at(socket, *ip, Some(nicd::Fabric::Roce))
                    .map_err(NicError::Nicd)?;
                drop(held);
                let which = nicd::choice::Which::Daemon {
                    socket: socket.clone(),
                };
                let tool = nicd::ondemand::tool_name();
                eprintln!(
                    "{}",
                    which.line(&tool, &ip.to_string(), Some(p.daemon_pid()))
                );
                let name = format!("{SOFT_DEVICE} ({ip}, nicd at {})", socket.display());
                let (p, direct): (Arc<dyn Provider>, _) = if nicd::data_here() {
                    let d = nicd::direct(p);
                    (d.clone(), Some(d))
                } else {
                    (p, None)
                };
                Nic::on(p, guid, PortNum(1), name, Kind::Nicd { ip: *ip, direct })
            }
        }
    }

    /// Opens port `spec` of an rdma-core device, libibverbs loaded as
    /// `opts` say.
    ///
    /// # Errors
    /// As [`Nic::open`].
    pub fn open_rdma_core(spec: &DeviceSpec, opts: rdmacore::Options) -> Result<Nic, NicError> {
        let core = rdmacore::RdmaCore::with_options(opts)?;
        let guid = core.find_port(spec)?;
        let p: Arc<dyn Provider> = core.clone();
        Nic::on(
            p,
            guid,
            PortNum(spec.port),
            spec.name.clone(),
            Kind::Core(core),
        )
    }

    fn on(
        p: Arc<dyn Provider>,
        guid: Guid,
        port: PortNum,
        name: String,
        kind: Kind,
    ) -> Result<Nic, NicError> {
        let device = format!("{name} port {}", port.0);
        let ca = p
            .open_ca(guid, 0, Arc::new(verbs::IgnoreEvents))
            .map_err(|source| NicError::Verbs {
                what: "open",
                device: device.clone(),
                source,
            })?;
        let attr = match p.query_port(ca, port) {
            Ok(a) => a,
            Err(source) => {
                let _ = p.close_ca(ca);
                return Err(NicError::Verbs {
                    what: "query",
                    device,
                    source,
                });
            }
        };
        if attr.state != PortState::Active {
            let _ = p.close_ca(ca);
            return Err(NicError::PortNotActive {
                device: name,
                port: port.0,
                state: attr.state,
            });
        }
        Ok(Nic {
            p,
            ca,
            guid,
            port,
            attr,
            name,
            kind,
        })
    }

    /// The provider, for the tool's verbs objects.
    pub fn provider(&self) -> &Arc<dyn Provider> {
        &self.p
    }

    /// The open CA.
    pub fn ca(&self) -> CaHandle {
        self.ca
    }

    /// The port the tool uses.
    pub fn port(&self) -> PortNum {
        self.port
    }

    /// The port as it was when opened (GIDs, active MTU).
    pub fn port_attr(&self) -> &PortAttr {
        &self.attr
    }

    /// The NIC in words: `rxe0`, `softroce0 (10.0.0.1)`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Moves QP `qp` of this NIC to INIT on its port (P_Key index 0),
    /// peers allowed `access`.
    ///
    /// # Errors
    /// The provider refused the transition.
    pub fn init_qp(
        &self,
        qp: verbs::QpHandle,
        access: rdma_types::AccessFlags,
    ) -> Result<(), verbs::VerbsError> {
        self.p.modify_qp(
            qp,
            &verbs::QpAttr {
                state: Some(rdma_types::QpState::Init),
                port: Some(self.port),
                pkey_index: Some(0),
                access: Some(access),
                ..Default::default()
            },
        )
    }

    /// An RC QP of the tool's own on the NIC (`send` and `recv` WRs
    /// deep, one CQ of `cqe`) and a buffer of `len` bytes registered with
    /// `access`: what `rpingpong`, `rrping` and `rperftest -R`'s exchange
    /// use.
    ///
    /// # Errors
    /// The verb that failed, named; what was made by then is given back.
    pub fn rc_qp(
        &self,
        cqe: u32,
        send: u32,
        recv: u32,
        len: usize,
        access: rdma_types::AccessFlags,
    ) -> Result<RcQp, (&'static str, verbs::VerbsError)> {
        let p = &self.p;
        let pd = p.alloc_pd(self.ca, 0).map_err(|e| ("allocate a PD", e))?;
        let made = (|| {
            let cq = p
                .create_cq(pd, &verbs::CqInit { cqe }, 0)
                .map_err(|e| ("create the CQ", e))?;
            let qp = match p.create_qp(pd, &verbs::QpInit::rc(cq, send, recv), 0) {
                Ok(qp) => qp,
                Err(e) => {
                    let _ = p.destroy_cq(cq);
                    return Err(("create the QP", e));
                }
            };
            let mem = verbs::MemBuf::new(len);
            match p.reg_mr(pd, &mem, mem.addr(), len as u64, access, 0) {
                Ok(mr) => Ok((cq, qp, mem, mr)),
                Err(e) => {
                    let _ = p.destroy_qp(qp);
                    let _ = p.destroy_cq(cq);
                    Err(("register the buffer", e))
                }
            }
        })();
        match made {
            Ok((cq, qp, mem, mr)) => Ok(RcQp {
                pd,
                cq,
                qp,
                mem,
                mr,
            }),
            Err(e) => {
                let _ = p.dealloc_pd(pd);
                Err(e)
            }
        }
    }

    /// The path MTU to use with a peer that wants `wanted`: at most the
    /// port's active MTU.
    pub fn path_mtu(&self, wanted: Mtu) -> Mtu {
        wanted.min(self.attr.active_mtu)
    }

    /// The address vector to `dgid` from our port and GID 0 (on an
    /// rdma-core device the provider shows the GID rdma-core's tools
    /// would pick there; on ours it is the IPv4-mapped address).
    pub fn av(&self, dgid: rdma_types::Gid) -> AhAttr {
        AhAttr {
            port: self.port,
            ..AhAttr::roce(dgid)
        }
    }

    /// Brings `qp` (in INIT) of this CA to RTR and RTS on a connection
    /// RDMA CM made to `peer`: `remote_qpn` and `remote_psn` as the CM
    /// reported them, `rq_psn` ours (unless the CM chose it), `depth` the
    /// RDMA READs in flight each way, the path MTU at most `mtu`.
    ///
    /// # Errors
    /// The provider refused a transition.
    #[allow(clippy::too_many_arguments)]
    pub fn cm_rtr_rts(
        &self,
        qp: verbs::QpHandle,
        peer: rdma_types::Gid,
        remote_qpn: rdma_types::Qpn,
        remote_psn: rdma_types::Psn,
        rq_psn: rdma_types::Psn,
        mtu: Mtu,
        depth: u8,
    ) -> Result<(), verbs::VerbsError> {
        use rdma_types::QpState;
        self.p.modify_qp(
            qp,
            &verbs::QpAttr {
                state: Some(QpState::Rtr),
                av: Some(self.av(peer)),
                path_mtu: Some(self.path_mtu(mtu)),
                dest_qpn: Some(remote_qpn),
                // A CM starting PSN is the first PSN its sender expects to
                // receive (IBA 12.7.25): ours is our receive PSN, the
                // peer's our send PSN.
                rq_psn: Some(rq_psn),
                max_dest_rd_atomic: Some(depth.max(1)),
                min_rnr_timer: Some(12),
                ..Default::default()
            },
        )?;
        self.p.modify_qp(
            qp,
            &verbs::QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(remote_psn),
                timeout: Some(14),
                retry_cnt: Some(7),
                rnr_retry: Some(7),
                max_rd_atomic: Some(depth.max(1)),
                ..Default::default()
            },
        )
    }

    /// Whether this is our soft iWARP NIC (its baseline is plain TCP).
    pub fn is_iwarp(&self) -> bool {
        matches!(self.kind, Kind::Iwarp { .. })
    }

    /// The soft NIC's counters (retransmissions, timeouts): our own NIC's,
    /// or with the NIC daemon the node of this process's QPs; `None` on
    /// an rdma-core device (and with the QPs in the daemon).
    pub fn soft_counters(&self) -> Option<rnic::softroce::SoftCaCounters> {
        match &self.kind {
            Kind::Soft { nic, .. } => nic.counters(self.guid),
            Kind::Nicd {
                direct: Some(d), ..
            } => d.nic()?.counters(self.guid),
            Kind::Core(_) | Kind::Nicd { .. } | Kind::Iwarp { .. } => None,
        }
    }

    /// RDMA CM on this CA: our CM agent on the soft NIC (its comm IDs
    /// from `first_comm_id`), the kernel's (`rdmacore::RdmaCm`) on an
    /// rdma-core device. Also the addresses it connects from.
    ///
    /// # Errors
    /// the kernel's RDMA CM missing (one line naming the module), a CA without an
    /// address, or the agent that did not start.
    pub fn rdma_cm(&self, first_comm_id: u32) -> Result<(Arc<dyn Service>, Vec<IpAddr>), NicError> {
        let err = |reason: String| NicError::Cm {
            device: self.name.clone(),
            reason,
        };
        match &self.kind {
            Kind::Soft { nic, ip } => {
                let agent = rdma_access::CmAgent::start(nic.clone(), self.guid, first_comm_id)
                    .map_err(|e| err(e.to_string()))?;
                Ok((agent, vec![*ip]))
            }
            Kind::Nicd { ip, .. } => {
                let agent = rdma_access::CmAgent::start(self.p.clone(), self.guid, first_comm_id)
                    .map_err(|e| err(e.to_string()))?;
                Ok((agent, vec![*ip]))
            }
            Kind::Iwarp { nic, ip } => {
                Ok((iwarp_tcp::IwarpCm::new(nic.clone(), self.guid), vec![*ip]))
            }
            Kind::Core(core) => {
                let cm =
                    rdmacore::RdmaCm::start(core, self.guid).map_err(|e| err(e.to_string()))?;
                let addrs = cm.addresses().to_vec();
                Ok((Arc::new(cm), addrs))
            }
        }
    }
}

impl std::fmt::Debug for Nic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Nic({} port {})", self.name, self.port.0)
    }
}

impl Drop for Nic {
    /// Closes the CA (the tool destroys its objects first).
    fn drop(&mut self) {
        let _ = self.p.close_ca(self.ca);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        dev: DeviceArgs,
    }

    fn parse(args: &[&str]) -> Result<DeviceArgs, String> {
        Cli::try_parse_from(std::iter::once("tool").chain(args.iter().copied()))
            .map(|c| c.dev)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn device_takes_a_name_and_port_and_softroce0_is_ours() {
        let d = parse(&["--device", "mlx5_0:2"]).unwrap();
        assert_eq!(
            d.rdma_core(),
            Some(&DeviceSpec {
                name: "mlx5_0".into(),
                port: 2
            })
        );
        // perftest's and rc_pingpong's -d, perftest's --ib-dev.
        assert_eq!(parse(&["-d", "rxe0"]).unwrap().rdma_core().unwrap().port, 1);
        assert!(parse(&["--ib-dev", "rxe0"]).unwrap().rdma_core().is_some());
        assert_eq!(parse(&["-d", "softroce0"]).unwrap().rdma_core(), None);
        assert_eq!(parse(&[]).unwrap().rdma_core(), None);
        let e = parse(&["--device", "rxe0:0"]).unwrap_err();
        assert!(e.contains("from 1 to 255"), "{e}");
        let e = parse(&["--device", "rxe 0"]).unwrap_err();
        assert!(e.contains("NAME:PORT"), "{e}");
    }

    #[test]
    fn the_soft_nic_needs_an_address_and_a_device_does_not() {
        let soft = DeviceArgs::default();
        let e = NicChoice::from_args(&soft, None, "--bind", 4791, Mtu::Mtu1024).unwrap_err();
        assert!(e.to_string().contains("give --bind"), "{e}");
        let dev = parse(&["--device", "rxe0"]).unwrap();
        let c = NicChoice::from_args(&dev, None, "--bind", 4791, Mtu::Mtu1024).unwrap();
        assert!(matches!(c, NicChoice::RdmaCore(s) if s.name == "rxe0"));
    }

    /// The path of a machine without rdma-core, whatever this host has.
    #[test]
    fn without_libibverbs_a_device_says_what_to_install_in_one_line() {
        let spec: DeviceSpec = "rxe0".parse().unwrap();
        let opts = rdmacore::Options {
            library: "/nonexistent/libibverbs.so.1".into(),
            ..Default::default()
        };
        let Err(e) = Nic::open_rdma_core(&spec, opts) else {
            panic!("opened a device without its library");
        };
        assert!(matches!(e, NicError::Load(_)), "{e:?}");
        let msg = e.to_string();
        assert!(!msg.contains('\n'), "{msg}");
        assert!(msg.contains("apt-get install libibverbs1"), "{msg}");
    }

    #[test]
    fn the_soft_nic_opens_active_with_its_mtu_and_ipv4_gid() {
        let c = NicChoice::Soft {
            ip: "127.0.0.1".parse().unwrap(),
            udp_port: 0,
            mtu: Mtu::Mtu1024,
            opts: rnic::softroce::NicOptions::default(),
        };
        let nic = Nic::open(&c).unwrap();
        assert_eq!(nic.path_mtu(Mtu::Mtu4096), Mtu::Mtu1024);
        assert_eq!(nic.path_mtu(Mtu::Mtu512), Mtu::Mtu512);
        assert!(nic.port_attr().gids[0].is_ipv4_mapped());
        assert_eq!(nic.name(), "softroce0 (127.0.0.1)");
        assert!(nic.soft_counters().is_some());
    }
}
