//! What srptd reports: `show`, sessions, devices, LUNs and the Prometheus
//! metrics text.

use super::*;

/// The soft RoCE NIC's counters by name, for `show` and the metrics.
pub(super) fn nic_counters(c: &rnic::softroce::SoftCaCounters) -> [(&'static str, u64); 9] {
    [
        ("packets_sent", c.tx_packets),
        ("datagrams_received", c.rx_datagrams),
        ("bad_icrc", c.rx_bad_icrc),
        ("retransmits", c.retransmits),
        ("retransmit_timeouts", c.timeouts),
        ("duplicate_requests", c.duplicates),
        ("out_of_sequence", c.out_of_sequence),
        ("sequence_naks_received", c.seq_naks_received),
        ("pkey_violations", c.pkey_violations),
    ]
}

impl Daemon {
    /// Every target's state; the first target's fields also at the top
    /// level, where they were before a file could have several.
    pub(super) fn show(&self) -> Value {
        let all: Vec<Value> = (0..self.targets.len())
            .map(|i| self.show_target(i))
            .collect();
        let mut v = all[0].clone();
        if let Value::Object(m) = &mut v {
            m.insert("log_level".into(), json!(self.log.level()));
            m.insert("targets".into(), Value::Array(all));
        }
        v
    }

    pub(super) fn show_target(&self, i: usize) -> Value {
        let c = lock(&self.cfg);
        let (t, rt) = (&c.targets[i], &self.targets[i]);
        // One look at what runs on the CA now (a device watcher may
        // replace it).
        let live = rt.live();
        let guid = live.guid.0;
        let sessions = live.port.sessions();
        let mut v = json!({
            "target": live.port.name(),
            "id_ext": format!("{guid:016x}"),
            "ioc_guid": format!("{guid:016x}"),
            "ip": t.ip.get_ref().to_string(),
            "udp_port": t.udp_port.get_ref(),
            "mtu": t.mtu.get_ref(),
            "rdma_cm_port": t.rdma_cm_port,
            "fabric": t.fabric,
            "lid": rt.lid(),
            "ib_cm_service_id": t.ib_cm.then(|| format!("{guid:016x}")),
            "enabled": live.port.enabled(),
            "rel_tgt_id": t.rel_tgt_id.get_ref(),
            "srp_max_req_size": t.srp_max_req_size.get_ref(),
            "srp_max_rsp_size": t.srp_max_rsp_size.get_ref(),
            "srp_max_rdma_size": t.srp_max_rdma_size.get_ref(),
            "srpt_srq_size": t.srpt_srq_size.get_ref(),
            "receive_buffers_posted": live.port.receive_buffers_posted(),
            "srpt_sq_size": t.srpt_sq_size.get_ref(),
            "max_channels": t.max_channels.get_ref(),
            "login_timeout_ms": t.login_timeout_ms.get_ref(),
            "max_pending_logins": t.max_pending_logins.get_ref(),
            "max_pending_per_initiator": t.max_pending_per_initiator.get_ref(),
            "keepalive_ms": t.keepalive_ms.get_ref(),
            "pkey": t.pkey.get_ref(),
            "sessions": sessions.len(),
            "channels": channel_phases(&sessions),
            "verbs_objects": live.access.live_total(),
            "cm_ids": live.access.live(rdma_access::resource::Kind::CmId),
            "mad_agents": live.access.live(rdma_access::resource::Kind::MadAgent),
            "sa_subscriptions": live.access.live(rdma_access::resource::Kind::SaSubscription),
        });
        let device = t.device.as_ref().map(|d| d.get_ref().clone());
        let iwarp = *t.iwarp.get_ref();
        drop(c);
        if let Value::Object(m) = &mut v {
            // What the NIC is; on an rdma-core device or iWARP the soft
            // RoCE settings (UDP port, MTU, fabric) do not apply, and the
            // address is the one the device's GID holds.
            if let Some(d) = device {
                for k in ["udp_port", "mtu", "fabric"] {
                    m.remove(k);
                }
                m.insert("device".into(), json!(d));
                m.insert("ip".into(), json!(live.port.gid().to_ip().to_string()));
                // What the device's port runs at (its netdev's MTU picks
                // the RoCE MTU), as ibv_devinfo shows it.
                if let Ok(a) = live.port.port_attr() {
                    m.insert("active_mtu".into(), json!(a.active_mtu.bytes()));
                    m.insert("port_state".into(), json!(format!("{:?}", a.state)));
                }
            } else if iwarp {
                for k in ["udp_port", "fabric"] {
                    m.remove(k);
                }
                m.insert("iwarp".into(), json!(true));
            }
            if let Some(c) = rt.nic.as_ref().and_then(|n| n.counters(live.guid)) {
                for (k, n) in nic_counters(&c) {
                    m.insert(format!("nic_{k}"), json!(n));
                }
            }
            m.insert("lun_stats".into(), self.lun_stats_json(rt));
        }
        v
    }

    /// A target's per-LUN counters, each with the name of its device
    /// (rows of a device removed since are left out).
    pub(super) fn lun_stats(&self, rt: &TargetRt) -> Vec<(String, srp_target::LunStats)> {
        let devs = lock(&self.devices);
        rt.port()
            .lun_stats()
            .into_iter()
            .filter_map(|s| {
                let name = devs.iter().find(|(_, d)| Arc::ptr_eq(d, &s.device))?.0;
                Some((name.clone(), s))
            })
            .collect()
    }

    pub(super) fn lun_stats_json(&self, rt: &TargetRt) -> Value {
        self.lun_stats(rt)
            .into_iter()
            .map(|(device, s)| {
                let c = s.counters;
                json!({
                    "lun": s.lun.value(),
                    "device": device,
                    "commands": c.commands,
                    "reads": c.reads,
                    "writes": c.writes,
                    "read_bytes": c.read_bytes,
                    "write_bytes": c.write_bytes,
                    "errors": c.errors,
                    "unit_attentions": c.unit_attentions,
                    "tmfs": c.tmfs,
                })
            })
            .collect()
    }

    pub(super) fn sessions(&self) -> Value {
        let v: Vec<Value> = self
            .targets
            .iter()
            .flat_map(|t| {
                let port = t.port();
                let name = port.name().to_string();
                port.sessions().into_iter().map(move |s| (name.clone(), s))
            })
            .map(|(target, s)| {
                json!({
                    "target": target,
                    "conn": s.conn.0,
                    "initiator": s.initiator,
                    "luns": self.scsi.visible_luns(&s.initiator, &target).iter().map(|l| l.value()).collect::<Vec<_>>(),
                    "window": s.window,
                    "credits": s.credits,
                    "in_flight": s.in_flight,
                    "commands": s.cmds,
                    "tmfs": s.tmfs,
                    "aers": s.aers,
                    "closing": s.closing,
                    "state": s.phase.as_str(),
                    "memory_bytes": s.memory,
                    "keepalives": s.keepalives,
                    "pkey": s.pkey.0,
                })
            })
            .collect();
        Value::Array(v)
    }

    pub(super) fn devices(&self) -> Value {
        let cfg = lock(&self.cfg);
        let devs = lock(&self.devices);
        let v: Vec<Value> = cfg
            .devices
            .iter()
            .filter_map(|d| {
                let dev = devs.get(d.name.get_ref())?;
                let s = dev.stats();
                Some(json!({
                    "name": d.name.get_ref(),
                    "handler": d.handler.get_ref().name(),
                    "filename": d.filename.as_ref().map(|f| f.get_ref().display().to_string()),
                    "size": dev.blocks() * dev.block_size() as u64,
                    "block_size": dev.block_size(),
                    "read_only": dev.config.read_only,
                    "threads_num": dev.config.threads_num,
                    "threads_pool_type": match dev.config.threads_pool {
                        scsi::ThreadsPool::PerInitiator => "per_initiator",
                        scsi::ThreadsPool::Shared => "shared",
                    },
                    "rotational": d.rotational,
                    "write_through": d.write_through,
                    "o_direct": d.o_direct,
                    "serial": dev.config.serial,
                    "naa": format!("{:016x}", dev.config.naa),
                    // A pass-through device whose node went away.
                    "gone": dev.pass_through_handler().is_some_and(|p| p.is_gone()),
                    "stats": {
                        "commands": s.commands, "reads": s.reads, "writes": s.writes,
                        "read_bytes": s.read_bytes, "write_bytes": s.write_bytes,
                        "errors": s.errors,
                    },
                }))
            })
            .collect();
        Value::Array(v)
    }

    pub(super) fn luns(&self) -> Value {
        let cfg = lock(&self.cfg);
        let map = |ls: &[LunEntry]| -> Vec<Value> {
            ls.iter()
                .map(|l| json!({ "lun": l.lun.get_ref(), "device": l.device.get_ref() }))
                .collect()
        };
        json!({
            "default": map(&cfg.luns),
            "groups": cfg.groups.iter().map(|g| json!({
                "name": g.name.get_ref(),
                "initiators": g.initiators.iter().map(|i| i.get_ref().clone()).collect::<Vec<_>>(),
                "luns": map(&g.luns),
            })).collect::<Vec<_>>(),
        })
    }

    /// Prometheus text exposition of the counters. Series of a target
    /// carry its name as the `target` label.
    pub fn metrics(&self) -> String {
        type Rows = Vec<(String, u64)>;
        let mut out = String::new();
        let mut metric = |name: &str, help: &str, kind: &str, rows: Rows| {
            out += &format!("# HELP {name} {help}\n# TYPE {name} {kind}\n");
            for (labels, v) in rows {
                out += &format!("{name}{labels} {v}\n");
            }
        };
        let names: Vec<String> = self
            .targets
            .iter()
            .map(|t| t.port().name().to_string())
            .collect();
        // One row per target: `f(target)`, labelled with its name.
        let per_target = |f: &dyn Fn(&TargetRt) -> u64| -> Rows {
            self.targets
                .iter()
                .zip(&names)
                .map(|(t, n)| (format!("{{target=\"{n}\"}}"), f(t)))
                .collect()
        };
        let nics: Vec<Option<[(&str, u64); 9]>> = self
            .targets
            .iter()
            .map(|t| {
                t.nic
                    .as_ref()
                    .and_then(|n| n.counters(t.live().guid))
                    .map(|c| nic_counters(&c))
            })
            .collect();
        for k in 0..9 {
            let Some(key) = nics.iter().flatten().next().map(|c| c[k].0) else {
                break;
            };
            let rows = nics
                .iter()
                .zip(&names)
                .filter_map(|(c, n)| Some((format!("{{target=\"{n}\"}}"), c.as_ref()?[k].1)))
                .collect();
            metric(
                &format!("srptd_nic_{key}_total"),
                "What the target's soft RoCE NIC counted since it was opened.",
                "counter",
                rows,
            );
        }
        metric(
            "srptd_verbs_objects",
            "Objects the target port (PDs, CQs, QPs, MRs, ...) and its CM agent (CM ids, MAD agents, SA subscriptions) hold through the access layer.",
            "gauge",
            per_target(&|t| t.live().access.live_total().max(0) as u64),
        );
        metric(
            "srptd_target_enabled",
            "Whether the target accepts logins.",
            "gauge",
            per_target(&|t| t.port().enabled() as u64),
        );
        let sessions: Vec<(&String, srp_target::SessionInfo)> = self
            .targets
            .iter()
            .zip(&names)
            .flat_map(|(t, n)| t.port().sessions().into_iter().map(move |s| (n, s)))
            .collect();
        metric(
            "srptd_channels",
            "Logged-in SRP channels.",
            "gauge",
            // From the sessions listed above, not a second walk of each port.
            per_target(&|t| {
                sessions
                    .iter()
                    .filter(|(n, _)| **n == t.port().name())
                    .count() as u64
            }),
        );
        let per = |f: fn(&srp_target::SessionInfo) -> u64| {
            sessions
                .iter()
                .map(|(t, s)| {
                    (
                        format!(
                            "{{target=\"{t}\",initiator=\"{}\",conn=\"{}\"}}",
                            s.initiator, s.conn.0
                        ),
                        f(s),
                    )
                })
                .collect::<Vec<_>>()
        };
        metric(
            "srptd_channel_commands_total",
            "SRP_CMDs accepted.",
            "counter",
            per(|s| s.cmds),
        );
        metric(
            "srptd_channel_tmfs_total",
            "SRP_TSK_MGMTs accepted.",
            "counter",
            per(|s| s.tmfs),
        );
        metric(
            "srptd_channel_aers_total",
            "SRP_AER_REQs sent.",
            "counter",
            per(|s| s.aers),
        );
        metric(
            "srptd_channel_credits",
            "Credits the initiator holds.",
            "gauge",
            per(|s| s.credits as u64),
        );
        metric(
            "srptd_channel_in_flight",
            "Commands in flight.",
            "gauge",
            per(|s| s.in_flight as u64),
        );
        let luns: Vec<(String, srp_target::LunCounters)> = self
            .targets
            .iter()
            .zip(&names)
            .flat_map(|(t, n)| {
                self.lun_stats(t).into_iter().map(move |(device, s)| {
                    (
                        format!(
                            "{{target=\"{n}\",lun=\"{}\",device=\"{device}\"}}",
                            s.lun.value()
                        ),
                        s.counters,
                    )
                })
            })
            .collect();
        type Counter = fn(&srp_target::LunCounters) -> u64;
        let lun_series: [(&str, &str, Counter); 8] = [
            (
                "commands",
                "SRP_CMDs the target executed at the LUN.",
                |c| c.commands,
            ),
            ("reads", "READs at the LUN that ended GOOD.", |c| c.reads),
            ("writes", "WRITEs at the LUN that ended GOOD.", |c| c.writes),
            ("read_bytes", "Data-in bytes of those READs.", |c| {
                c.read_bytes
            }),
            ("write_bytes", "Data-out bytes of those WRITEs.", |c| {
                c.write_bytes
            }),
            (
                "errors",
                "Commands at the LUN that ended in CHECK CONDITION for an error (not a unit attention).",
                |c| c.errors,
            ),
            (
                "unit_attentions",
                "Commands at the LUN that ended in CHECK CONDITION with UNIT ATTENTION (a new nexus, a reset, a change), which the initiator retries.",
                |c| c.unit_attentions,
            ),
            (
                "tmfs",
                "Task management functions addressed to the LUN.",
                |c| c.tmfs,
            ),
        ];
        for (name, help, f) in lun_series {
            let rows = luns.iter().map(|(l, c)| (l.clone(), f(c))).collect();
            metric(&format!("srptd_lun_{name}_total"), help, "counter", rows);
        }
        let devs: Vec<(String, scsi::DeviceStats)> = lock(&self.devices)
            .iter()
            .map(|(n, d)| (format!("{{device=\"{n}\"}}"), d.stats()))
            .collect();
        let col = |f: fn(&scsi::DeviceStats) -> u64| {
            devs.iter().map(|(l, s)| (l.clone(), f(s))).collect()
        };
        metric(
            "srptd_device_commands_total",
            "Commands a device executed.",
            "counter",
            col(|s| s.commands),
        );
        metric(
            "srptd_device_read_bytes_total",
            "Bytes read.",
            "counter",
            col(|s| s.read_bytes),
        );
        metric(
            "srptd_device_write_bytes_total",
            "Bytes written.",
            "counter",
            col(|s| s.write_bytes),
        );
        metric(
            "srptd_device_errors_total",
            "Commands ended in CHECK CONDITION.",
            "counter",
            col(|s| s.errors),
        );
        out
    }
}

/// A port's channels by state: `{"pending": n, "live": n, "closing": n}`,
/// with the memory the port holds for them.
pub(super) fn channel_phases(sessions: &[srp_target::SessionInfo]) -> Value {
    let count = |p: srp_target::ChannelPhase| sessions.iter().filter(|s| s.phase == p).count();
    json!({
        "pending": count(srp_target::ChannelPhase::Pending),
        "live": count(srp_target::ChannelPhase::Live),
        "closing": count(srp_target::ChannelPhase::Closing),
        "memory_bytes": sessions.iter().map(|s| s.memory).sum::<usize>(),
    })
}
