//! rpingpong against itself as two processes, through the
//! ibv_rc_pingpong-style exchange.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn two_rpingpong_processes_ping_pong() {
    let bin = env!("CARGO_BIN_EXE_rpingpong");
    let mut server = Command::new(bin)
        .env("NICD_MODE", "own")
        .args([
            "--bind",
            "127.0.50.2",
            "-g",
            "1",
            "-p",
            "18650",
            "-n",
            "200",
            "-s",
            "3000",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for "waiting on" (bounded) before starting the client.
    let stdout = server.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("server output");
        if line.contains("waiting on") {
            break;
        }
        assert!(Instant::now() < deadline, "server never waited");
    }
    let out = Command::new(bin)
        .env("NICD_MODE", "own")
        .args([
            "127.0.50.2",
            "--bind",
            "127.0.50.1",
            "-g",
            "1",
            "-p",
            "18650",
            "-n",
            "200",
            "-s",
            "3000",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("remote address: LID 0x0000") && text.contains("GID ::ffff:127.0.50.2"),
        "{text}"
    );
    assert!(text.contains("1200000 bytes in"), "{text}");
    assert!(server.wait().unwrap().success());
}
