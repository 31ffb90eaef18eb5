//! What the tools' two-process tests share: a server started with its
//! stdout read line by line, and a bounded wait for a process to end.

use std::io::{BufRead, BufReader, Lines};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// Starts tool `bin` with `args` on a NIC of its own (`NICD_MODE=own`; a
/// test of the NIC daemon gives `--nicd`), its stdout piped: the child,
/// its first line (a server's banner: it listens by then) and the lines
/// after it.
pub fn serve(bin: &str, args: &[&str]) -> (Child, String, Lines<BufReader<ChildStdout>>) {
    let mut child = Command::new(bin)
        .env("NICD_MODE", "own")
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    (child, first, lines)
}

/// Waits at most `secs` for `child` to end; its status must be success
/// (`what` names it, `context` goes in the failure message).
pub fn ends_well(child: &mut Child, what: &str, secs: u64, context: &dyn std::fmt::Debug) {
    let waited = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            assert!(s.success(), "{what} exited {s}: {context:?}");
            return;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(secs),
            "{what} did not end in {secs} s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
