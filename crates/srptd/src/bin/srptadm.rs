//! `srptadm`: administers a running `srptd` over its control socket (what
//! `scstadmin` does for SCST): list targets, sessions, devices and LUN
//! maps; add and remove devices, LUNs, groups and initiators at runtime;
//! enable or disable the target; save the running configuration.

#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};
use serde_json::Value;
use srptd::daemon::{request, Request};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "srptadm", version, about = "Administer a running srptd")]
struct Cli {
    /// srptd's control socket.
    #[arg(
        long,
        short = 's',
        visible_alias = "control-socket",
        default_value_os_t = srptd::config::default_control_socket()
    )]
    socket: PathBuf,
    /// Print the daemon's JSON answer instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Add a device.
    AddDevice {
        /// The device's name (LUNs map it by this name).
        name: String,
        /// vdisk_fileio, vdisk_blockio, vdisk_nullio or ram.
        #[arg(long)]
        handler: String,
        /// The file or block device (vdisk_fileio, vdisk_blockio).
        #[arg(long)]
        filename: Option<PathBuf>,
        /// Size in bytes or with K, M, G, T, e.g. 64M (ram, nullio;
        /// creates a missing fileio file).
        #[arg(long, value_parser = srptd::config::size_arg)]
        size: Option<String>,
        /// Logical block size in bytes (512, 4k).
        #[arg(long, default_value = "512", value_parser = rdma_types::units::size::<u32>)]
        block_size: u32,
        #[arg(long)]
        read_only: bool,
        /// Report a rotating medium (VPD B1h).
        #[arg(long)]
        rotational: bool,
        /// vdisk_fileio: writes durable before they complete.
        #[arg(long)]
        write_through: bool,
        /// vdisk_fileio: bypass the page cache (O_DIRECT).
        #[arg(long)]
        o_direct: bool,
    },
    /// Change a setting of the running daemon.
    #[command(subcommand)]
    Set(SetCmd),
    /// Every other command is the control protocol's request itself.
    #[command(flatten)]
    Request(Request),
}

#[derive(Subcommand)]
enum SetCmd {
    /// The least important log records srptd writes (SCST's trace_level):
    /// debug also logs every admin query.
    LogLevel {
        #[arg(value_enum)]
        level: srptd::log::Level,
    },
}

fn toml_str(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let req = match cli.cmd {
        Cmd::AddDevice {
            name,
            handler,
            filename,
            size,
            block_size,
            read_only,
            rotational,
            write_through,
            o_direct,
        } => {
            // JSON strings are valid TOML basic strings.
            let mut t = format!(
                "name = {}\nhandler = {}\nblock_size = {block_size}\nread_only = {read_only}\n\
                 rotational = {rotational}\nwrite_through = {write_through}\no_direct = {o_direct}\n",
                toml_str(&name),
                toml_str(&handler)
            );
            if let Some(f) = filename {
                t += &format!("filename = {}\n", toml_str(&f.to_string_lossy()));
            }
            if let Some(s) = size {
                t += &format!("size = {}\n", toml_str(&s));
            }
            Request::AddDevice { toml: t }
        }
        Cmd::Set(SetCmd::LogLevel { level }) => Request::SetLogLevel { level },
        Cmd::Request(req) => req,
    };
    match request(&cli.socket, &req) {
        Ok(v) => {
            if cli.json {
                println!("{v}");
            } else {
                print!("{}", human(&req, &v));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("srptadm: {e}");
            ExitCode::FAILURE
        }
    }
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// Per-LUN counters as a table.
fn lun_table(rows: &Value) -> String {
    let mut out = format!(
        "{:>5} {:<12} {:>10} {:>9} {:>9} {:>14} {:>14} {:>7} {:>5} {:>5}\n",
        "lun",
        "device",
        "commands",
        "reads",
        "writes",
        "read_bytes",
        "write_bytes",
        "errors",
        "tmfs",
        "UAs"
    );
    for r in rows.as_array().into_iter().flatten() {
        out += &format!(
            "{:>5} {:<12} {:>10} {:>9} {:>9} {:>14} {:>14} {:>7} {:>5} {:>5}\n",
            s(&r["lun"]),
            s(&r["device"]),
            s(&r["commands"]),
            s(&r["reads"]),
            s(&r["writes"]),
            s(&r["read_bytes"]),
            s(&r["write_bytes"]),
            s(&r["errors"]),
            s(&r["tmfs"]),
            s(&r["unit_attentions"]),
        );
    }
    out
}

/// The answer as text for a person.
fn human(req: &Request, v: &Value) -> String {
    let mut out = String::new();
    match req {
        Request::Show => {
            // Every target (the top level repeats the first one's fields).
            for (i, t) in v["targets"].as_array().into_iter().flatten().enumerate() {
                if i > 0 {
                    out += "\n";
                }
                if let Value::Object(m) = t {
                    for (k, val) in m.iter().filter(|(k, _)| *k != "lun_stats") {
                        out += &format!("{k:<18} {}\n", s(val));
                    }
                }
                out += &lun_table(&t["lun_stats"]);
            }
        }
        Request::Sessions => {
            out += &format!(
                "{:<39} {:<6} {:<36} {:>6} {:>7} {:>9} {:>10} {:>5} {:>5}  luns\n",
                "target",
                "conn",
                "initiator",
                "window",
                "credits",
                "in_flight",
                "commands",
                "tmfs",
                "aers"
            );
            for r in v.as_array().into_iter().flatten() {
                out += &format!(
                    "{:<39} {:<6} {:<36} {:>6} {:>7} {:>9} {:>10} {:>5} {:>5}  {}{}\n",
                    s(&r["target"]),
                    s(&r["conn"]),
                    s(&r["initiator"]),
                    s(&r["window"]),
                    s(&r["credits"]),
                    s(&r["in_flight"]),
                    s(&r["commands"]),
                    s(&r["tmfs"]),
                    s(&r["aers"]),
                    s(&r["luns"]),
                    match r["state"].as_str() {
                        Some("pending") => " (pending)",
                        Some("closing") => " (closing)",
                        _ => "",
                    }
                );
            }
        }
        Request::Devices => {
            out += &format!(
                "{:<12} {:<14} {:>14} {:>5} {:<18} {:>10} {:>10} {:>7}  file\n",
                "name", "handler", "size", "bs", "naa", "reads", "writes", "errors"
            );
            for r in v.as_array().into_iter().flatten() {
                out += &format!(
                    "{:<12} {:<14} {:>14} {:>5} {:<18} {:>10} {:>10} {:>7}  {}\n",
                    s(&r["name"]),
                    s(&r["handler"]),
                    s(&r["size"]),
                    s(&r["block_size"]),
                    s(&r["naa"]),
                    s(&r["stats"]["reads"]),
                    s(&r["stats"]["writes"]),
                    s(&r["stats"]["errors"]),
                    s(&r["filename"]),
                );
            }
        }
        Request::Luns => {
            out += "default LUNs:\n";
            for l in v["default"].as_array().into_iter().flatten() {
                out += &format!("  LUN {:<5} {}\n", s(&l["lun"]), s(&l["device"]));
            }
            for g in v["groups"].as_array().into_iter().flatten() {
                out += &format!("group {}:\n", s(&g["name"]));
                for i in g["initiators"].as_array().into_iter().flatten() {
                    out += &format!("  initiator {}\n", s(i));
                }
                for l in g["luns"].as_array().into_iter().flatten() {
                    out += &format!("  LUN {:<5} {}\n", s(&l["lun"]), s(&l["device"]));
                }
            }
        }
        _ => out += &format!("ok: {v}\n"),
    }
    out
}
