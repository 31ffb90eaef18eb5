//! `nicd`: the NIC daemon. Owns the soft RoCE NIC of each `--ip` (UDP
//! port 4791 there) and serves every process of the host through its
//! socket (`nicd::NicdProvider` is the client side).

#![forbid(unsafe_code)]

use clap::Parser;
use rdma_access::subnet::Fabric;
use rnic::softroce::{NicOptions, Personality, SoftCa, SoftRoce, ROCE_PORT};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Parser)]
#[command(
    name = "nicd",
    version,
    about = "The NIC daemon: one soft RoCE NIC for every process"
)]
struct Args {
    /// Address of a NIC to serve (repeat for several), on the --fabric
    /// [default: 127.0.0.1, unless --ib-ip is given].
    #[arg(long)]
    ip: Vec<IpAddr>,
    /// Address of a NIC to serve on the `ib` fabric whatever --fabric
    /// says (repeat for several): one daemon serves RoCE ports and a
    /// managed subnet's ports at once, each at an address of its own.
    #[arg(long, value_name = "IP")]
    ib_ip: Vec<IpAddr>,
    /// RoCEv2 UDP port of every NIC.
    #[arg(long, default_value_t = ROCE_PORT)]
    udp_port: u16,
    /// The fabric of every --ip NIC, and of a NIC a client adds without
    /// naming one: `roce` (ports ACTIVE at once, no subnet manager) or
    /// `ib` (a managed subnet: each port waits in INIT until a subnet
    /// manager, such as `ibsm run --node IP`, brings it ACTIVE with a
    /// LID; the daemon answers its SMPs on QP0).
    #[arg(long, value_enum, default_value_t = Fabric::Roce)]
    fabric: Fabric,
    /// Path MTU in bytes: 256, 512, 1024, 2048 or 4096.
    #[arg(long, value_parser = rdma_types::Mtu::parse, default_value = "4096")]
    mtu: rdma_types::Mtu,
    /// Most QPs one client may hold at once.
    #[arg(long, default_value_t = nicd::Limits::default().max_qps)]
    max_qps: usize,
    /// Most memory one client may have registered at once (its rings'
    /// memory counts too), in bytes or with a unit (64G).
    #[arg(long, value_parser = rdma_types::units::size::<u64>, default_value = "64G")]
    max_registered: u64,
    /// How long each client's ring poller spins after its last work
    /// before it sleeps on the client's doorbell, in microseconds
    /// (longer: fewer doorbells on a busy queue, more CPU spent; only
    /// with --ring-pollers).
    #[arg(long, default_value_t = nicd::server::DEFAULT_RING_SPIN.as_micros() as u64)]
    ring_spin_us: u64,
    /// A thread per client polls its rings, as earlier builds did [default:
    /// each NIC's own thread takes the rings of its queues, waking at the
    /// clients' doorbells: one thread on the data path, not two].
    #[arg(long)]
    ring_pollers: bool,
    /// Lend clients no member of the NICs' UDP ports [default: each RoCE
    /// port is shared, so a client runs its own QPs' transport on the
    /// NIC's address (the kernel steers each datagram by its QP number);
    /// QP1 and the rings' QPs stay here].
    #[arg(long)]
    no_shared_ports: bool,
    /// Print the running daemon's clients (process, user, what each
    /// holds) and exit.
    #[arg(long)]
    clients: bool,
    /// Leave after this long without a client (a duration: 30s, 500ms;
    /// a plain number is seconds) [default: never]. Tools that start
    /// the daemon on demand give it (`NICD_IDLE_EXIT`, else 30s).
    #[arg(long, value_parser = rdma_types::units::secs)]
    idle_exit: Option<std::time::Duration>,
    /// The clients' socket [default: /run/nicd.sock for root,
    /// $XDG_RUNTIME_DIR/nicd.sock, else $TMPDIR/nicd-<uid>.sock].
    #[arg(long, env = nicd::SOCKET_ENV)]
    socket: Option<PathBuf>,
}

fn main() -> ExitCode {
    if let Some(code) = cli_docs::write_if_asked(<Args as clap::CommandFactory>::command, "8") {
        return code;
    }
    daemon_ctl::log_to_stderr();
    let args = Args::parse();
    let signals = daemon_ctl::signals::block_term();
    let options = match NicOptions::from_env() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("nicd: {e}");
            return ExitCode::from(2);
        }
    };
    let mut ips = args.ip.clone();
    if ips.is_empty() && args.ib_ip.is_empty() {
        ips.push(IpAddr::from([127, 0, 0, 1]));
    }
    let mut ib_ips = args.ib_ip.clone();
    if args.fabric == Fabric::Ib {
        ib_ips.append(&mut ips);
    }
    if let Some(both) = ips.iter().find(|ip| ib_ips.contains(ip)) {
        eprintln!(
            "nicd: {both} is given with --ip and --ib-ip: one address is one port on one fabric"
        );
        return ExitCode::from(2);
    }
    let ips: Vec<IpAddr> = ips.into_iter().chain(ib_ips.iter().copied()).collect();
    let euid = nicd::euid();
    let socket = args.socket.unwrap_or_else(|| {
        nicd::default_socket(euid, std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from))
    });
    if args.clients {
        return print_clients(&socket);
    }
    let provider = SoftRoce::with_options(SoftCa::at_each(&ips), args.udp_port, args.mtu, options);
    let limits = nicd::Limits {
        max_qps: args.max_qps,
        max_registered: args.max_registered,
    };
    for ip in &ib_ips {
        let guid = rnic::softroce::ip_guid(*ip);
        if let Err(e) = provider.set_personality(guid, Personality::Ib) {
            eprintln!("nicd: {ip} on the ib fabric: {e}");
            return ExitCode::FAILURE;
        }
    }
    let server = nicd::Server::with_limits(provider.clone(), limits);
    // A client (root or this user) may have it serve another address (on
    // the `ib` fabric with the port's SMA).
    let shared = (!args.no_shared_ports)
        .then(|| nicd::shared::SharedPorts::new(provider.clone(), args.udp_port));
    if let Some(sh) = &shared {
        server.lend_ports_with(sh.clone());
    }
    let nics = Arc::new(Nics {
        soft: provider.clone(),
        shared: shared.clone(),
        default: args.fabric,
        socket: socket.clone(),
        server: Arc::downgrade(&server),
        smas: std::sync::Mutex::new(None),
    });
    server.add_nics_with(nics.clone());
    server.set_ring_spin(std::time::Duration::from_micros(args.ring_spin_us));
    if !args.ring_pollers {
        server.set_data_path(Arc::new(provider.clone()));
    }
    // A daemon started on demand may follow one that is leaving for
    // want of clients, whose NICs let go of their UDP ports a moment
    // after its socket went: it tries again for a little while.
    let patience = if args.idle_exit.is_some() {
        std::time::Duration::from_secs(3)
    } else {
        std::time::Duration::ZERO
    };
    let began = std::time::Instant::now();
    // Clients of a daemon that went hold members of its ports' groups
    // until they close their NICs, which they do as they hear it went:
    // a daemon started in its place waits for that.
    let stale = std::sync::atomic::AtomicBool::new(false);
    let share = || -> Result<(), (rdma_types::Guid, verbs::VerbsError)> {
        let Some(sh) = &shared else { return Ok(()) };
        for ip in ips.iter().filter(|ip| !ib_ips.contains(ip)) {
            sh.share(*ip).map_err(|e| {
                let busy = e.kind() == std::io::ErrorKind::ResourceBusy;
                stale.store(busy, std::sync::atomic::Ordering::Relaxed);
                let e = verbs::VerbsError::InvalidArgument(e.to_string());
                (rnic::softroce::ip_guid(*ip), e)
            })?;
        }
        Ok(())
    };
    const STALE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);
    let mut claimed = share().and_then(|()| server.claim_nics());
    while claimed.is_err()
        && (began.elapsed() < patience
            || (stale.load(std::sync::atomic::Ordering::Relaxed)
                && began.elapsed() < STALE_PATIENCE))
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
        claimed = share().and_then(|()| server.claim_nics());
    }
    if let Err((guid, e)) = claimed {
        let ip = ips.iter().find(|ip| rnic::softroce::ip_guid(**ip) == guid);
        let ip = ip.map_or_else(|| format!("{guid:?}"), |ip| ip.to_string());
        eprintln!("nicd: {ip} (UDP port {}): {e}", args.udp_port);
        return ExitCode::FAILURE;
    }
    let listener = match nicd::server::bind(&socket, euid == 0) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("nicd: {}: {e}", socket.display());
            return ExitCode::FAILURE;
        }
    };
    // On the `ib` fabric each port's SMA, through a client of our own
    // (privileged: this user), so its MADs go by the daemon's QP1 like
    // every client's; kept until the daemon stops. They start before any
    // client is served (a tool that started this daemon connects as soon
    // as the socket exists, and its requests wait in the socket's queue
    // until then): through a socket of their own, gone once they run.
    if !ib_ips.is_empty() {
        let mut name = socket.file_name().unwrap_or_default().to_owned();
        name.push(".smas");
        let private = socket.with_file_name(name);
        let started = nicd::server::bind(&private, false)
            .map_err(|e| format!("{}: {e}", private.display()))
            .and_then(|l| {
                server.serve(l);
                nics.start_smas(&private, &ib_ips)
            });
        let _ = std::fs::remove_file(&private);
        if let Err(e) = started {
            eprintln!("nicd: the ib fabric's SMAs: {e}");
            let _ = std::fs::remove_file(&socket);
            return ExitCode::FAILURE;
        }
    }
    server.serve(listener);
    if let Some(idle) = args.idle_exit {
        leave_when_idle(server.clone(), socket.clone(), idle);
    }
    let shown: Vec<String> = ips
        .iter()
        .map(|i| match ib_ips.contains(i) && args.fabric != Fabric::Ib {
            true => format!("{i} (ib)"),
            false => i.to_string(),
        })
        .collect();
    tracing::info!("nicd: serving {} on {}", shown.join(", "), socket.display());
    println!("nicd: serving {} on {}", shown.join(", "), socket.display());
    let sig = signals.wait();
    tracing::info!("nicd: {}: stopping", daemon_ctl::signals::name(sig));
    let _ = std::fs::remove_file(&socket);
    ExitCode::SUCCESS
}

/// The NICs a client adds: on the fabric it names, else the daemon's
/// `--fabric`; an `ib` one with its port's SMA once the daemon serves it
/// (the SMAs start with the first `ib` port).
struct Nics {
    soft: Arc<SoftRoce>,
    shared: Option<Arc<nicd::shared::SharedPorts>>,
    default: Fabric,
    socket: PathBuf,
    server: std::sync::Weak<nicd::Server>,
    smas: std::sync::Mutex<Option<Arc<Smas>>>,
}

impl Nics {
    /// Starts the SMAs of the `ib` ports at `ips` (the first ones, as a
    /// client at `socket`: the daemon's QP0 keeper from then on), or adds
    /// theirs to those running.
    fn start_smas(&self, socket: &std::path::Path, ips: &[IpAddr]) -> Result<(), String> {
        let mut smas = self.smas.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = &*smas {
            return ips.iter().try_for_each(|ip| s.add(*ip));
        }
        let s = Smas::start(socket, ips)?;
        // A subnet manager through the daemon borrows its port's QP0.
        if let Some(server) = self.server.upgrade() {
            server.keep_qp0_with(s.clone());
        }
        *smas = Some(s);
        Ok(())
    }
}

impl nicd::server::AddNics for Nics {
    fn add(&self, ip: IpAddr, fabric: Option<Fabric>) -> verbs::Result<rdma_types::Guid> {
        let guid =
            nicd::server::AddNics::add(&self.soft, ip, Some(fabric.unwrap_or(self.default)))?;
        if let Some(sh) = &self.shared {
            // A new RoCE NIC is shared before its first open (one served
            // already is shared, or an `ib` one, which is not).
            if self.soft.personality(guid) == Personality::Roce {
                if let Err(e) = sh.share(ip) {
                    nicd::server::AddNics::forget(&self.soft, guid);
                    return Err(verbs::VerbsError::InvalidArgument(e.to_string()));
                }
            }
        }
        Ok(guid)
    }

    fn forget(&self, guid: rdma_types::Guid) {
        if let Some(sh) = &self.shared {
            sh.unshare(guid);
        }
        nicd::server::AddNics::forget(&self.soft, guid);
    }

    fn added(&self, ip: IpAddr, guid: rdma_types::Guid) {
        if self.soft.personality(guid) != Personality::Ib {
            return;
        }
        match self.start_smas(&self.socket, &[ip]) {
            Ok(()) => tracing::info!("nicd: the SMA of {ip} runs"),
            Err(e) => tracing::warn!("nicd: the SMA of {ip} did not start: {e}"),
        }
    }
}

/// The SMA of the port of each address (`--fabric ib`): an
/// [`rdma_access::IbNode`] on the daemon's NIC through a client of the
/// daemon, holding the port's QP0 except while a subnet manager of the
/// port (a privileged client) borrows it.
struct Smas {
    client: Arc<nicd::NicdProvider>,
    ips: std::sync::Mutex<Vec<IpAddr>>,
    nodes: std::sync::Mutex<std::collections::HashMap<rdma_types::Guid, rdma_access::IbNode>>,
    /// Ports where a client serves device management (their SMA says so
    /// again when it starts anew after lending its QP0).
    dm: std::sync::Mutex<std::collections::HashMap<rdma_types::Guid, bool>>,
}

impl Smas {
    /// Starts the SMA of each address's port, through the daemon at
    /// `socket`.
    fn start(socket: &std::path::Path, ips: &[IpAddr]) -> Result<Arc<Smas>, String> {
        let client = nicd::NicdProvider::connect(socket).map_err(|e| e.to_string())?;
        let smas = Arc::new(Smas {
            client,
            ips: std::sync::Mutex::new(ips.to_vec()),
            nodes: std::sync::Mutex::new(std::collections::HashMap::new()),
            dm: std::sync::Mutex::new(std::collections::HashMap::new()),
        });
        for ip in ips {
            smas.start_one(*ip)?;
        }
        Ok(smas)
    }

    /// Starts the SMA of an address added to the daemon.
    fn add(&self, ip: IpAddr) -> Result<(), String> {
        {
            let mut ips = self.ips.lock().unwrap_or_else(|e| e.into_inner());
            if ips.contains(&ip) {
                return Ok(());
            }
            ips.push(ip);
        }
        self.start_one(ip)
    }

    fn start_one(&self, ip: IpAddr) -> Result<(), String> {
        let guid = rnic::softroce::ip_guid(ip);
        let k = self
            .ips
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .position(|i| *i == ip)
            .unwrap_or(0) as u32;
        // Communication IDs of their own, apart from the clients'.
        let first_comm_id = 0x7e00_0000 | (k << 16);
        let dm = self
            .dm
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&guid)
            .copied()
            .unwrap_or(false);
        let node = rdma_access::IbNode::start(
            self.client.clone(),
            guid,
            &format!("nicd {ip}"),
            dm,
            first_comm_id,
        )
        .map_err(|e| format!("{ip}: {e}"))?;
        self.nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(guid, node);
        Ok(())
    }
}

impl nicd::server::Qp0Keeper for Smas {
    fn lend(&self, guid: rdma_types::Guid) -> bool {
        let node = self
            .nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&guid);
        let lent = node.is_some();
        // Stopped: its QPs, QP0 among them, are gone when this returns.
        drop(node);
        if lent {
            tracing::info!("nicd: the SMA of {guid:?} lends its QP0 to a subnet manager");
        }
        lent
    }

    fn device_management(&self, guid: rdma_types::Guid, served: bool) {
        let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(node) = nodes.get(&guid) {
            // Trap 144 tells the SM, whose PortInfoRecords then show it.
            node.sma()
                .set_capability_mask(rdma_access::sma::ca_capability_mask(served));
        }
        self.dm
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(guid, served);
    }

    fn take_back(&self, guid: rdma_types::Guid) {
        let ip = self
            .ips
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .find(|ip| rnic::softroce::ip_guid(*ip) == guid);
        let Some(ip) = ip else {
            return;
        };
        match self.start_one(ip) {
            Ok(()) => tracing::info!("nicd: the SMA of {ip} has its QP0 back"),
            Err(e) => tracing::warn!("nicd: the SMA of {ip} did not start again: {e}"),
        }
    }
}

/// `--idle-exit`: a thread that ends the process once it has had no
/// client for `idle`. It decides holding the start lock of the socket
/// (`nicd::ondemand`), so a tool that found this daemon and is
/// connecting under that lock is served, and one that comes after finds
/// no socket and starts a daemon anew.
fn leave_when_idle(
    server: std::sync::Arc<nicd::Server>,
    socket: PathBuf,
    idle: std::time::Duration,
) {
    let long = std::time::Duration::from_secs(3600);
    // The daemon's own clients (an `ib` fabric's SMAs) are not users.
    let own = std::process::id() as i32;
    let none = move |c: &[nicd::proto::ClientReport]| c.iter().all(|r| r.peer.pid == own);
    let spawned = std::thread::Builder::new()
        .name("nicd-idle".into())
        .spawn(move || loop {
            if !server.wait_until(long, |c, _| none(c)) {
                continue;
            }
            if server.wait_until(idle, |c, _| !none(c)) {
                continue;
            }
            let lock = match nicd::ondemand::lock(&socket) {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!("nicd: idle, but {e}: staying");
                    continue;
                }
            };
            if !none(&server.clients()) {
                continue;
            }
            let _ = std::fs::remove_file(&socket);
            tracing::info!("nicd: no client for {idle:?}: leaving");
            println!("nicd: no client for {idle:?}: leaving");
            drop(lock);
            std::process::exit(0);
        });
    if let Err(e) = spawned {
        tracing::warn!("nicd: no idle watch ({e}): staying until stopped");
    }
}

/// `--clients`: one line per client of the daemon at `socket`.
fn print_clients(socket: &std::path::Path) -> ExitCode {
    let p = match nicd::NicdProvider::connect(socket) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("nicd: {e}");
            return ExitCode::FAILURE;
        }
    };
    // What each runs itself (an older daemon lends nothing).
    let lent = p.lent_ports().unwrap_or_default();
    match p.daemon_clients() {
        Ok(clients) => {
            for c in clients {
                println!("{c}");
                for l in lent.iter().filter(|l| l.client == c.peer.id) {
                    let qpns = roce_udp::block_qpns(l.block);
                    println!(
                        "  its own QPs on NIC {:#018x}: block {} of the shared port (QP numbers \
                         {:#08x}-{:#08x})",
                        l.guid.0,
                        l.block,
                        qpns.start,
                        qpns.end - 1
                    );
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("nicd: {}: {e}", socket.display());
            ExitCode::FAILURE
        }
    }
}
