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
        /// vdisk_fileio, vdisk_blockio, vdisk_nullio, ram, pass-through
        /// (SCST's dev_disk; --filename /dev/sgN) or vcdrom (--filename an
        /// ISO image, none: no disc).
        #[arg(long)]
        handler: String,
        /// The file or block device (vdisk_fileio, vdisk_blockio), the sg
        /// node (pass-through), or the ISO image (vcdrom).
        #[arg(long)]
        filename: Option<PathBuf>,
        /// Size in bytes or with K, M, G, T, e.g. 64M (ram, nullio;
        /// creates a missing fileio file).
        #[arg(long, value_parser = srptd::config::size_arg)]
        size: Option<String>,
        /// Logical block size in bytes (512, 4k; default 512). Not for
        /// pass-through or vcdrom, whose device or disc has its own.
        #[arg(long, value_parser = rdma_types::units::size::<u32>)]
        block_size: Option<u32>,
        /// Threads of the device's own for its commands (SCST's
        /// threads_num; default 0: the target port's shared workers).
        #[arg(long)]
        threads_num: Option<u32>,
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
    // `--write-docs DIR`: man pages and completions (dist/README.md).
    if let Some(code) = cli_docs::write_if_asked(<Cli as clap::CommandFactory>::command, "8") {
        return code;
    }
    let cli = Cli::parse();
    let req = match cli.cmd {
        Cmd::AddDevice {
            name,
            handler,
            filename,
            size,
            block_size,
            threads_num,
            read_only,
            rotational,
            write_through,
            o_direct,
        } => {
            // JSON strings are valid TOML basic strings.
            let mut t = format!(
                "name = {}\nhandler = {}\nread_only = {read_only}\n\
                 rotational = {rotational}\nwrite_through = {write_through}\no_direct = {o_direct}\n",
                toml_str(&name),
                toml_str(&handler)
            );
            // Only when given: the pass-through and vcdrom handlers refuse
            // the key (their device or disc has its own).
            if let Some(b) = block_size {
                t += &format!("block_size = {b}\n");
            }
            if let Some(n) = threads_num {
                t += &format!("threads_num = {n}\n");
            }
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

/// Rows under a header, each column as wide as its widest cell (long
/// device names and keys keep the columns aligned). A column whose
/// header starts with `>` is right-aligned (numbers); the last column is
/// not padded.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let names: Vec<&str> = header.iter().map(|h| h.trim_start_matches('>')).collect();
    let width: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, |x| x.chars().count()))
                .chain([names[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[&str]| {
        let mut out = String::new();
        for (c, cell) in cells.iter().enumerate() {
            let last = c + 1 == cells.len();
            let w = width[c];
            let padded = if header[c].starts_with('>') {
                format!("{cell:>w$}")
            } else if last {
                cell.to_string()
            } else {
                format!("{cell:<w$}")
            };
            out += &padded;
            out += if last { "\n" } else { "  " };
        }
        out
    };
    let mut out = line(&names);
    for r in rows {
        out += &line(&r.iter().map(String::as_str).collect::<Vec<_>>());
    }
    out
}

/// Per-LUN counters as a table.
fn lun_table(rows: &Value) -> String {
    let keys = [
        "lun",
        "device",
        "commands",
        "reads",
        "writes",
        "read_bytes",
        "write_bytes",
        "errors",
        "tmfs",
        "unit_attentions",
    ];
    let rows: Vec<Vec<String>> = rows
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| keys.iter().map(|k| s(&r[*k])).collect())
        .collect();
    table(
        &[
            ">lun",
            "device",
            ">commands",
            ">reads",
            ">writes",
            ">read_bytes",
            ">write_bytes",
            ">errors",
            ">tmfs",
            ">UAs",
        ],
        &rows,
    )
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
                    let fields: Vec<(&String, &Value)> =
                        m.iter().filter(|(k, _)| *k != "lun_stats").collect();
                    let w = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
                    for (k, val) in fields {
                        out += &format!("{k:<w$}  {}\n", s(val));
                    }
                }
                out += &lun_table(&t["lun_stats"]);
            }
        }
        Request::Sessions => {
            let rows: Vec<Vec<String>> = v
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| {
                    let state = match r["state"].as_str() {
                        Some("pending") => " (pending)",
                        Some("closing") => " (closing)",
                        _ => "",
                    };
                    [
                        "target",
                        "conn",
                        "initiator",
                        "window",
                        "credits",
                        "in_flight",
                        "commands",
                        "tmfs",
                        "aers",
                    ]
                    .iter()
                    .map(|k| s(&r[*k]))
                    .chain([format!("{}{state}", s(&r["luns"]))])
                    .collect()
                })
                .collect();
            out += &table(
                &[
                    "target",
                    "conn",
                    "initiator",
                    ">window",
                    ">credits",
                    ">in_flight",
                    ">commands",
                    ">tmfs",
                    ">aers",
                    "luns",
                ],
                &rows,
            );
        }
        Request::Devices => {
            let rows: Vec<Vec<String>> = v
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| {
                    vec![
                        s(&r["name"]),
                        s(&r["handler"]),
                        s(&r["size"]),
                        s(&r["block_size"]),
                        s(&r["naa"]),
                        s(&r["stats"]["reads"]),
                        s(&r["stats"]["writes"]),
                        s(&r["stats"]["errors"]),
                        s(&r["filename"]),
                    ]
                })
                .collect();
            out += &table(
                &[
                    "name", "handler", ">size", ">bs", "naa", ">reads", ">writes", ">errors",
                    "file",
                ],
                &rows,
            );
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
        Request::TargetGroups => {
            let rows: Vec<Vec<String>> = v["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|g| {
                    let ports: Vec<String> = g["ports"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|p| match p["target"].as_str() {
                            Some(t) => format!("{} ({t})", s(&p["rel_tgt_id"])),
                            None => format!("{} (remote)", s(&p["rel_tgt_id"])),
                        })
                        .collect();
                    vec![
                        s(&g["group_id"]),
                        s(&g["name"]),
                        s(&g["state"]),
                        if g["preferred"] == Value::Bool(true) {
                            "yes".into()
                        } else {
                            "no".into()
                        },
                        ports.join(", "),
                    ]
                })
                .collect();
            if rows.is_empty() {
                out += "no target port groups (ALUA off)\n";
            } else {
                out += &table(&[">group_id", "name", "state", "preferred", "ports"], &rows);
                out += &format!(
                    "explicit transitions (SET TARGET PORT GROUPS): {}\n",
                    if v["explicit"] == Value::Bool(true) {
                        "allowed"
                    } else {
                        "refused"
                    }
                );
            }
        }
        Request::Roles => {
            let rows: Vec<Vec<String>> = v["devices"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|d| {
                    let groups: Vec<String> = d["groups"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(s)
                        .collect();
                    vec![
                        s(&d["device"]),
                        s(&d["minor"]),
                        d["status_file_says"].as_str().unwrap_or("-").to_string(),
                        s(&d["following"]),
                        if d["open"] == Value::Bool(true) {
                            "open".into()
                        } else {
                            "closed".into()
                        },
                        groups.join(","),
                        d["error"].as_str().unwrap_or("").to_string(),
                    ]
                })
                .collect();
            if rows.is_empty() {
                out += "no DRBD devices (no [[device]] has drbd_minor)\n";
            } else {
                out += &table(
                    &[
                        "device",
                        ">minor",
                        "status_file",
                        "following",
                        "store",
                        "groups",
                        "last_error",
                    ],
                    &rows,
                );
            }
        }
        _ => {
            out += &srptd::daemon::answer_text(req, v).unwrap_or_else(|| v.to_string());
            out += "\n";
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tables_stay_aligned_with_long_names() {
        let devices = json!([
            {"name": "d0", "handler": "ram", "size": 4096, "block_size": 512,
             "naa": null, "stats": {"reads": 1, "writes": 22, "errors": 0}, "filename": null},
            {"name": "a-much-longer-device-name", "handler": "vdisk_fileio", "size": 1048576,
             "block_size": 4096, "naa": "6001405abc", "stats": {"reads": 333, "writes": 4,
             "errors": 0}, "filename": "/tmp/x.img"},
        ]);
        let text = human(&Request::Devices, &devices);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        // Every column starts where its header does.
        for col in ["handler", "naa", "file"] {
            let at = lines[0].find(col).unwrap();
            for l in &lines[1..] {
                assert_ne!(l.as_bytes()[at], b' ', "{col} misaligned:\n{text}");
                assert_eq!(l.as_bytes()[at - 1], b' ', "{col} misaligned:\n{text}");
            }
        }
        // Right-aligned numbers end where their header ends.
        let end = lines[0].find("reads").unwrap() + "reads".len();
        assert!(
            lines[1][..end].ends_with(" 1") && lines[2][..end].ends_with("333"),
            "{text}"
        );
    }

    #[test]
    fn show_keys_line_up_however_long() {
        let v = json!({"targets": [{"name": "t", "sa_subscriptions": 0, "lun_stats": []}]});
        let text = human(&Request::Show, &v);
        // Where each line's value starts: after its key and the spaces.
        let col: Vec<usize> = text
            .lines()
            .take(2)
            .map(|l| {
                let key = l.find(' ').unwrap();
                key + l[key..].find(|c: char| c != ' ').unwrap()
            })
            .collect();
        assert_eq!(col[0], col[1], "{text}");
    }

    #[test]
    fn write_commands_answer_in_words() {
        let add = Request::AddLun {
            group: None,
            lun: 3,
            device: "extra".into(),
        };
        let v =
            json!({"group": null, "lun": 3, "device": "extra", "size": 67108864, "aer_sent": 2});
        assert_eq!(
            human(&add, &v),
            "added LUN 3 (extra, 64 MiB) to the default LUNs; \
             2 sessions told (unit attention and SRP_AER_REQ)\n"
        );
        let v = json!({"lun_map_changes": 1, "aer_sent": 0, "enabled": true,
                       "needs_restart": ["target[1] parameters other than enabled"]});
        let t = human(&Request::Reload, &v);
        assert!(
            t.starts_with(
                "reloaded the configuration: 1 LUN map change, no session to tell; \
                           not applied until srptd restarts: target[1] parameters"
            ),
            "{t}"
        );
        assert!(!t.contains('{'), "no JSON in the words: {t}");
    }
}
