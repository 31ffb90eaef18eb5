//! `srp discover` with srp_daemon's options, against a real `srptd` on
//! 127.0.178.17 and `srpd` on .18 (discovery from .19): `-o` walks once
//! and exits, `-c` prints login strings, `-e` logs in through srpd, a
//! target srpd is logged in to already is left out unless `-a`, and `-a
//! -e` prints it without logging in twice; the long forms do the same.
//!
//! Skipped when the machine lacks FUSE (srpd needs it), a failure under
//! `CI=true` (`rdma_testkit::need`).

mod common;

use common::{text, Proc};
use std::process::Output;
use std::time::{Duration, Instant};

/// srptd at 127.0.178.17: its GUID (0002c903 and the address) is the
/// target port ID and the service ID.
const LINE: &str = "id_ext=0002c9037f00b211,ioc_guid=0002c9037f00b211,\
                    dgid=00000000000000000000ffff7f00b211,pkey=ffff,service_id=0002c9037f00b211";

/// The login strings `srp discover` printed.
fn login_lines(o: &Output) -> Vec<String> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.starts_with("id_ext="))
        .map(str::to_string)
        .collect()
}

#[test]
fn srp_daemon_options_once_all_and_login_strings() {
    if !rdma_testkit::need::fuse() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("srp-discover-flags-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let root = dir.join("mnt");
    std::fs::create_dir_all(&root).unwrap();
    let target = Proc::start(
        "srptd",
        common::tool(common::srptd_bin())
            .args(["--ip", "127.0.178.17", "--ram-mib", "8"])
            .arg("--control-socket")
            .arg(dir.join("srptd.sock")),
    );
    target.wait_line("listening on", 20);
    let sock = dir.join("srpd.sock");
    let srpd = Proc::start(
        "srpd",
        common::tool(common::srpd_bin())
            .args(["--ip", "127.0.178.18"])
            .arg("--mount-root")
            .arg(&root)
            .arg("--control-socket")
            .arg(&sock),
    );
    srpd.wait_line("srpd: ready on", 20);
    let sock_s = sock.to_str().unwrap().to_string();
    let discover = |flags: &[&str]| -> (Output, Duration) {
        let t = Instant::now();
        let o = common::tool(common::srp_bin())
            .args([
                "discover",
                "--target",
                "127.0.178.17",
                "--ip",
                "127.0.178.19",
            ])
            .args(["--control-socket", &sock_s])
            .args(flags)
            .output()
            .unwrap();
        (o, t.elapsed())
    };
    let logins = || -> Vec<serde_json::Value> {
        let o = common::tool(common::srp_bin())
            .args(["list", "--json", "--control-socket", &sock_s])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout)
            .unwrap()
            .as_array()
            .cloned()
            .unwrap_or_default()
    };

    // -o -c: one walk, the login string, exit.
    let (o, took) = discover(&["-o", "-c"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(login_lines(&o), vec![LINE.to_string()], "{}", text(&o));
    assert!(took < Duration::from_secs(10), "-o took {took:?}");
    assert!(logins().is_empty(), "nothing logged in without -e");

    // -o -e: logged in through srpd.
    let (o, _) = discover(&["-o", "-e"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("# logged in as t0"), "{}", text(&o));
    assert_eq!(logins().len(), 1);

    // Logged in already: left out without -a ...
    let (o, _) = discover(&["-o", "-v"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(login_lines(&o).is_empty(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("# logged in already: {LINE}")),
        "{}",
        text(&o)
    );
    // ... printed with it, and -a -e does not log in a second time.
    for flags in [&["-o", "-a"][..], &["-o", "-a", "-e"], &["-oac"]] {
        let (o, _) = discover(flags);
        assert!(o.status.success(), "{flags:?}: {}", text(&o));
        assert_eq!(
            login_lines(&o),
            vec![LINE.to_string()],
            "{flags:?}: {}",
            text(&o)
        );
        assert!(
            !text(&o).contains("logged in as"),
            "{flags:?}: {}",
            text(&o)
        );
    }
    let l = logins();
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!(l[0]["name"], "t0");
    assert_eq!(l[0]["channels"][0]["closed"], false, "{l:?}");

    // The long forms mean the same.
    let (o, _) = discover(&["--once", "--all", "--login-strings"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(login_lines(&o), vec![LINE.to_string()]);

    // Once and a rescan period contradict each other.
    let (o, _) = discover(&["-o", "-R", "1"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("cannot be used with"), "{}", text(&o));
    drop(srpd);
    let _ = std::fs::remove_dir_all(&dir);
}
