//! Man pages and shell completions of our binaries, made from the clap
//! definitions that parse their command lines, so the two cannot drift.
//!
//! Each binary with a command line calls [`write_if_asked`] first thing in
//! `main`. Run as `BINARY --write-docs DIR` it writes
//! - `DIR/man/man<S>/<name>.<S>`: the binary's page and one per
//!   subcommand (`srptadm-add-lun.8`), in section `S` (8 for the daemons
//!   and their admin tool, 1 for user commands), and
//! - `DIR/completions/bash/<name>`, `DIR/completions/zsh/_<name>` and
//!   `DIR/completions/fish/<name>.fish`,
//!
//! prints each path, and exits. The option is a packaging step
//! (`dist/README.md`), not in `--help`. Nothing else here reads the
//! command line or the environment.

#![forbid(unsafe_code)]

use clap::Command;
use clap_complete::Shell;
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The argument that asks for the documents.
pub const FLAG: &str = "--write-docs";

/// The directory `--write-docs DIR` names, when the process was started
/// so (as its first argument); `None` otherwise.
pub fn asked() -> Option<PathBuf> {
    let mut args = std::env::args_os().skip(1);
    (args.next()? == FLAG).then(|| args.next().map(PathBuf::from))?
}

/// When started as `BINARY --write-docs DIR`: writes the documents of
/// `cmd()` in man section `section` and returns how the process ends;
/// `None` (and nothing done) otherwise.
pub fn write_if_asked(cmd: impl FnOnce() -> Command, section: &str) -> Option<ExitCode> {
    let dir = asked()?;
    Some(match write(cmd(), section, &dir) {
        Ok(paths) => {
            for p in paths {
                println!("{}", p.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{FLAG} {}: {e}", dir.display());
            ExitCode::FAILURE
        }
    })
}

/// Writes the man pages and completions of `cmd` under `dir` (see the
/// crate's doc); returns the files written.
///
/// # Errors
/// A directory or file that cannot be made.
pub fn write(cmd: Command, section: &str, dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let name = cmd.get_name().to_string();
    let mut out = Vec::new();
    let man = dir.join("man").join(format!("man{section}"));
    std::fs::create_dir_all(&man)?;
    pages(&cmd, section, &man, &mut out)?;
    for (shell, sub, file) in [
        (Shell::Bash, "bash", name.clone()),
        (Shell::Zsh, "zsh", format!("_{name}")),
        (Shell::Fish, "fish", format!("{name}.fish")),
    ] {
        let d = dir.join("completions").join(sub);
        std::fs::create_dir_all(&d)?;
        let path = d.join(file);
        let mut f = std::fs::File::create(&path)?;
        clap_complete::generate(shell, &mut cmd, name.clone(), &mut f);
        out.push(path);
    }
    Ok(out)
}

/// The page of `cmd` and of each visible subcommand, depth first.
fn pages(cmd: &Command, section: &str, dir: &Path, out: &mut Vec<PathBuf>) -> io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        pages(sub, section, dir, out)?;
    }
    let page = clap_mangen::Man::new(cmd.clone())
        .section(section)
        .manual("SRP over RDMA")
        .source(format!("rdma-srp {}", env!("CARGO_PKG_VERSION")));
    out.push(page.generate_to(dir)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction};

    #[test]
    fn pages_for_the_command_and_its_subcommands_and_three_completions() {
        let cmd = Command::new("demo")
            .about("A demo tool")
            .arg(
                Arg::new("verbose")
                    .long("verbose")
                    .action(ArgAction::SetTrue),
            )
            .subcommand(Command::new("add-lun").about("Map a LUN"))
            .subcommand(Command::new("secret").hide(true));
        let dir = std::env::temp_dir().join(format!("cli-docs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let files = write(cmd, "8", &dir).unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|p| p.strip_prefix(&dir).unwrap().display().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "man/man8/demo-add-lun.8",
                "man/man8/demo.8",
                "completions/bash/demo",
                "completions/zsh/_demo",
                "completions/fish/demo.fish"
            ]
        );
        let page = std::fs::read_to_string(dir.join("man/man8/demo.8")).unwrap();
        assert!(page.starts_with(".ie"), "roff: {page}");
        assert!(page.contains(".TH demo 8"), "{page}");
        assert!(
            page.contains("add\\-lun") && page.contains("verbose"),
            "{page}"
        );
        let bash = std::fs::read_to_string(dir.join("completions/bash/demo")).unwrap();
        assert!(
            bash.contains("add-lun") && bash.contains("--verbose"),
            "{bash}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
