//! The verbs conformance suite over the client provider against a `nicd`
//! process (as users run it): every region registered is a memfd the
//! daemon maps in its own address space, so every RDMA READ, WRITE and
//! atomic of the suite crosses processes. Port control is the daemon's
//! own NIC's, out of this process's reach: declared missing here (the
//! in-process fixture, `conformance_nicd.rs`, runs those cases).

mod common;

use common::fresh_ip;
use rdma_types::{Guid, Lid};
use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use verbs::conformance::{Feature, Fixture};
use verbs::{Provider, Result, VerbsError};

struct Spawned {
    nicd: Child,
    client: Arc<nicd::NicdProvider>,
    guids: (Guid, Guid),
    socket: std::path::PathBuf,
}

impl Spawned {
    fn new() -> Spawned {
        let (a, b) = (fresh_ip(150), fresh_ip(150));
        let socket =
            std::env::temp_dir().join(format!("nicd-proc-{}-{a}.sock", std::process::id()));
        let mut nicd = Command::new(env!("CARGO_BIN_EXE_nicd"))
            .args(["--ip", &a.to_string(), "--ip", &b.to_string(), "--socket"])
            .arg(&socket)
            .env("SOFTROCE_FOLLOW_LINK", "0")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(nicd.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("nicd: serving"), "{line:?}");
        let guid = |ip: IpAddr| rnic::softroce::ip_guid(ip);
        let client = nicd::NicdProvider::connect(&socket).unwrap();
        Spawned {
            nicd,
            client,
            guids: (guid(a), guid(b)),
            socket,
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.nicd.kill();
        let _ = self.nicd.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Fixture for Spawned {
    fn provider(&self) -> Arc<dyn Provider> {
        self.client.clone()
    }
    fn guids(&self) -> (Guid, Guid) {
        self.guids
    }
    fn set_port_active(&self, _: Guid, _: bool) -> Result<()> {
        Err(VerbsError::NotSupported(
            "port control of another process's NIC",
        ))
    }
    fn set_lid(&self, _: Guid, _: Lid) -> Result<()> {
        Err(VerbsError::NotSupported(
            "port control of another process's NIC",
        ))
    }
    fn remove_ca(&self, _: Guid) -> Result<()> {
        Err(VerbsError::NotSupported(
            "port control of another process's NIC",
        ))
    }
    /// Soft RoCE's gaps, raw QP1 sends (the daemon's QP1 is shared and
    /// routes by contents), and port control (the pkey_change case asks
    /// for it first).
    fn lacks(&self) -> Vec<Feature> {
        vec![Feature::Apm, Feature::PortControl, Feature::RawGsi]
    }
}

verbs::conformance_tests!(Spawned::new());
