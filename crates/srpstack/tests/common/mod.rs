//! What the process tests share: a child process whose stdout lines are
//! read on a thread, so a test can wait (bounded) for a line.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A child process, killed on drop.
pub struct Proc {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    name: &'static str,
}

impl Proc {
    /// Starts `cmd` with its stdout piped.
    pub fn start(name: &'static str, cmd: &mut Command) -> Proc {
        let mut child = cmd.stdout(Stdio::piped()).spawn().expect("spawn");
        let out = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        Proc { child, lines, name }
    }

    /// Waits at most `secs` for a line containing `what`; returns it.
    pub fn wait_line(&self, what: &str, secs: u64) -> String {
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            match self
                .lines
                .recv_timeout(end.saturating_duration_since(Instant::now()))
            {
                Ok(l) if l.contains(what) => return l,
                Ok(_) => {}
                Err(e) => panic!("{} never said `{what}`: {e}", self.name),
            }
        }
    }

    /// Every further line until the process closes its stdout (exits),
    /// waiting at most `secs`.
    #[allow(dead_code)]
    pub fn rest(&self, secs: u64) -> Vec<String> {
        let end = Instant::now() + Duration::from_secs(secs);
        let mut out = Vec::new();
        loop {
            match self
                .lines
                .recv_timeout(end.saturating_duration_since(Instant::now()))
            {
                Ok(l) => out.push(l),
                Err(mpsc::RecvTimeoutError::Disconnected) => return out,
                Err(e) => panic!("{} still running after {secs} s: {e}", self.name),
            }
        }
    }

    /// Sends SIGTERM.
    #[allow(dead_code)]
    pub fn term(&mut self) {
        // SAFETY: kill with our child's pid and a valid signal.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
