//! The `ibsm run` process, the tools' command lines and soft RoCE `ib`
//! nodes, for the tests that run them (each test file uses a part).
#![allow(dead_code)]

use rdma_access::{IbNode, IbNodeError};
use rdma_types::Guid;
use rnic::softroce::{Personality, SoftRoce};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// [`IbNode::start`] on soft RoCE CA `guid` (not yet open), put in the
/// `ib` personality first.
pub fn ib_node(
    p: Arc<SoftRoce>,
    guid: Guid,
    description: &str,
    dm: bool,
    first_comm_id: u32,
) -> Result<IbNode, IbNodeError> {
    p.set_personality(guid, Personality::Ib)
        .expect("a soft RoCE CA not yet open");
    IbNode::start(p, guid, description, dm, first_comm_id)
}

/// Runs a finished command: whether it succeeded, and its stdout then
/// stderr.
pub fn output_of(cmd: &mut Command) -> (bool, String) {
    let o = cmd.output().unwrap();
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

/// `saquery --sa SA --ip IP --timeout-ms 200 ARGS`.
pub fn saquery(sa: &str, ip: &str, args: &[&str]) -> (bool, String) {
    output_of(
        Command::new(env!("CARGO_BIN_EXE_saquery"))
            .env("NICD_MODE", "own")
            .args(["--sa", sa, "--ip", ip, "--timeout-ms", "200"])
            .args(args),
    )
}

/// The `ibsm` process; killed if the test ends without stopping it.
pub struct Ibsm {
    child: Option<Child>,
    out: std::path::PathBuf,
}

impl Ibsm {
    /// Starts `ibsm run ARGS`; `tag` names its output file.
    pub fn start(tag: &str, args: &[&str]) -> Ibsm {
        let out = std::env::temp_dir().join(format!("ibsm-{tag}-{}.out", std::process::id()));
        let file = std::fs::File::create(&out).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_ibsm"))
            .env("NICD_MODE", "own")
            .arg("run")
            .args(args)
            .stdout(Stdio::from(file.try_clone().unwrap()))
            .stderr(Stdio::from(file))
            .spawn()
            .unwrap();
        Ibsm {
            child: Some(child),
            out,
        }
    }

    /// What it printed so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// SIGKILL, and reaped.
    pub fn kill(&mut self) {
        let mut c = self.child.take().expect("running");
        c.kill().unwrap();
        c.wait().unwrap();
    }

    /// Waits at most `within` for the process to end; its success and
    /// output.
    pub fn wait(&mut self, within: Duration) -> (bool, String) {
        let mut c = self.child.take().expect("running");
        let end = Instant::now() + within;
        let status = loop {
            if let Some(s) = c.try_wait().unwrap() {
                break s;
            }
            if Instant::now() >= end {
                let _ = c.kill();
                let _ = c.wait();
                panic!("ibsm did not stop within {within:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        (status.success(), self.output())
    }

    /// Waits at most `within` for the output so far to satisfy `done`.
    pub fn wait_output(&self, within: Duration, done: impl Fn(&str) -> bool) -> String {
        let end = Instant::now() + within;
        loop {
            let out = self.output();
            if done(&out) {
                return out;
            }
            assert!(Instant::now() < end, "ibsm output never got there:\n{out}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM, then [`Ibsm::wait`] up to `within`.
    pub fn terminate(&mut self, within: Duration) -> (bool, String) {
        let pid = self.child.as_ref().expect("running").id();
        let ok = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -TERM {pid}");
        self.wait(within)
    }
}

impl Drop for Ibsm {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(&self.out);
    }
}
