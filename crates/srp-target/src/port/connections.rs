//! Connections: logins (from the CM's REQ to the RTU), their bounds and
//! timeouts, keepalives, and closing a channel.

use super::*;

/// A connection (one SRP channel) of this port; never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

// Issued in sequence by the port.
impl rdma_types::RingId for ConnId {
    fn ring_index(self) -> u64 {
        self.0
    }
}

/// The initiator's end of a connection, from the CM REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerQp {
    /// Initiator QP number.
    pub qpn: Qpn,
    /// The REQ's starting PSN: the first PSN the initiator expects to
    /// receive, so the target's send PSN (IBA 12.7.25; Linux ib_cm sets
    /// the passive side's sq_psn from it, as the captured rping shows).
    pub psn: Psn,
    /// Initiator port GID.
    pub gid: Gid,
    /// Initiator port LID (0 on RoCE).
    pub lid: Lid,
    /// Path MTU.
    pub mtu: Mtu,
    /// RDMA READs the target may have outstanding at the initiator: the
    /// REP's initiator depth, at most the REQ's responder resources (IBA
    /// 12.7.29). The target fetches data-out by RDMA READ, so a login
    /// offering 0 is refused.
    pub initiator_depth: u8,
    /// The QP's local ACK timeout exponent (4.096 us * 2^n): the REQ's
    /// (twice the path's packet lifetime, as Linux's CM gives a passive
    /// QP), at least 14 (67 ms); 14 for a caller without a CM.
    pub ack_timeout: u8,
    /// The first PSN the target's QP receives when the CM chose it (the
    /// kernel's CM under librdmacm announces its own in the REP); `None`:
    /// the port picks one and the REP carries it.
    pub local_psn: Option<Psn>,
}

/// Why the target closed a channel by itself, for its log (the initiator
/// closing it is reported by the CM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// The target logged the initiator out (SRP_T_LOGOUT with this reason:
    /// a protocol violation, a SINGLE login replacing the channel, the
    /// LUN mapping removed, shutdown).
    TargetLogout(TLogoutReason),
    /// The initiator asked to log out (SRP_I_LOGOUT).
    InitiatorLogout,
    /// A work request failed and left the QP in error.
    WorkRequestFailed {
        /// The completion status.
        status: WcStatus,
        /// Which kind of work request.
        what: &'static str,
    },
    /// The idle channel's keepalive (a zero-length RDMA WRITE) failed: the
    /// initiator's port no longer acknowledges (its host or process died
    /// without logging out).
    PeerGone {
        /// The keepalive's completion status.
        status: WcStatus,
    },
    /// The CM never established the login (no RTU) within
    /// `login_timeout`.
    LoginTimeout(std::time::Duration),
    /// The oldest unfinished login, dropped to make room for a new one
    /// when `max_pending_logins` were unfinished.
    LoginEvicted {
        /// The limit that was reached.
        limit: usize,
    },
}

impl std::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CloseReason::TargetLogout(r) => write!(f, "target logout: {r}"),
            CloseReason::InitiatorLogout => write!(f, "the initiator logged out"),
            CloseReason::WorkRequestFailed { status, what } => {
                write!(f, "{what} failed ({status:?}): the QP is in error")
            }
            CloseReason::PeerGone { status } => write!(
                f,
                "the initiator no longer answers: the idle channel's keepalive failed ({status:?})"
            ),
            CloseReason::LoginTimeout(t) => write!(
                f,
                "the login was not established (no CM RTU) within {} ms (login_timeout)",
                t.as_millis()
            ),
            CloseReason::LoginEvicted { limit } => write!(
                f,
                "an unfinished login dropped for a newer one: {limit} logins were unfinished (max_pending_logins raises it)"
            ),
        }
    }
}

/// Why a login's partition cannot be served ([`SetupError::Partition`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartitionError {
    /// The login named no partition and the port's P_Key table holds none
    /// of [`PortOptions::pkeys`].
    #[error(
        "the port's P_Key table ({}) holds none of the partitions served ({})",
        pkey_list(table),
        pkey_list(served)
    )]
    NoneServed {
        /// The port's P_Key table.
        table: Vec<Pkey>,
        /// The partitions the port serves.
        served: Vec<Pkey>,
    },
    /// The served partition chosen left the table while it was looked up.
    #[error("P_Key {:04x} left the table", .0.0)]
    LeftTable(Pkey),
    /// The login's partition is not among [`PortOptions::pkeys`].
    #[error(
        "P_Key {:04x}: the target does not serve that partition (it serves {})",
        pkey.0,
        pkey_list(served)
    )]
    NotServed {
        /// The login's partition.
        pkey: Pkey,
        /// The partitions the port serves.
        served: Vec<Pkey>,
    },
    /// Both ends are limited members of the partition (IBA 10.9.3: they
    /// may not talk).
    #[error(
        "P_Key {:04x}: the initiator and the target port are both limited members of that partition (its P_Key table: {})",
        pkey.0,
        pkey_list(table)
    )]
    BothLimited {
        /// The login's partition.
        pkey: Pkey,
        /// The port's P_Key table.
        table: Vec<Pkey>,
    },
    /// The port's P_Key table has no entry for the partition (the SM has
    /// not made the port a member).
    #[error(
        "P_Key {:04x}: the target port is not a member of that partition (its P_Key table: {})",
        pkey.0,
        pkey_list(table)
    )]
    NotMember {
        /// The login's partition.
        pkey: Pkey,
        /// The port's P_Key table.
        table: Vec<Pkey>,
    },
}

/// The valid keys of `keys`, as four hex digits each.
fn pkey_list(keys: &[Pkey]) -> String {
    keys.iter()
        .filter(|k| k.is_valid())
        .map(|k| format!("{:04x}", k.0))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A channel's place in its life, as `srptadm show` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelPhase {
    /// Accepted, the CM's RTU not yet come.
    Pending,
    /// Established.
    Live,
    /// Closing: waiting for its work requests to drain.
    Closing,
}

impl ChannelPhase {
    /// The word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            ChannelPhase::Pending => "pending",
            ChannelPhase::Live => "live",
            ChannelPhase::Closing => "closing",
        }
    }
}

/// The target's end of an accepted connection, for the CM REP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalQp {
    /// Target QP number.
    pub qpn: Qpn,
    /// The REP's starting PSN: the first PSN the target expects to receive
    /// (the initiator sends from it).
    pub psn: Psn,
}

/// What to answer a login with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoginOutcome {
    /// Send `rsp` (SRP_LOGIN_RSP) as REP private data with `local`.
    Accepted {
        /// The connection, for [`TargetPort::disconnected`].
        conn: ConnId,
        /// The target QP, already in RTS.
        local: LocalQp,
        /// SRP_LOGIN_RSP bytes.
        rsp: Vec<u8>,
    },
    /// Send `rej` (SRP_LOGIN_REJ) as REJ private data.
    Rejected {
        /// SRP_LOGIN_REJ bytes.
        rej: Vec<u8>,
        /// Why, for logs (its `Display` names the limit and the setting
        /// that raises it where one refused the login).
        reason: LoginRefusal,
    },
}

/// Why the port refused a login ([`LoginOutcome::Rejected`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoginRefusal {
    /// The SRP target refused it (SRP r16a 6.4, `srp::target`).
    #[error("{}", srp_words(.reason, .detail, .other_port))]
    Srp {
        /// The SRP_LOGIN_REJ reason.
        reason: LoginRejReason,
        /// `srp::target`'s words for it (the limit and the setting that
        /// raises it), when it has them.
        detail: Option<String>,
        /// Set when the login could not be associated with a channel
        /// because it names another target port (an initiator still using
        /// an old id_ext or ioc_guid, say).
        other_port: Option<OtherTargetPort>,
    },
    /// The REQ offers the target no RDMA READ at the initiator.
    #[error("the initiator's QP takes no RDMA READ (REQ responder resources 0): the target could not fetch data-out")]
    NoRdmaRead,
    /// The initiator port has `max_pending_per_initiator` logins that are
    /// not established yet.
    #[error("the initiator has {pending} logins not yet established, the most one initiator port may have (max_pending_per_initiator = {limit} raises it)")]
    TooManyPending {
        /// Its logins not yet established.
        pending: usize,
        /// `max_pending_per_initiator`.
        limit: usize,
    },
    /// The channel's QP, CQ or send slots could not be set up, or its
    /// partition is not served.
    #[error("cannot set up the RDMA channel: {0}")]
    Channel(#[from] SetupError),
}

/// [`LoginRefusal::Srp`] in words: `srp::target`'s if it has them, else
/// the reason's, then which target port the login named if not this one.
fn srp_words(
    reason: &LoginRejReason,
    detail: &Option<String>,
    other_port: &Option<OtherTargetPort>,
) -> String {
    let words = detail.clone().unwrap_or_else(|| reason.to_string());
    match other_port {
        Some(o) => format!("{words}: {o}"),
        None => words,
    }
}

/// The target port a login named, and this port's ([`LoginRefusal::Srp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "it names target port id_ext {:016x} ioc_guid {:016x}, this port is id_ext {:016x} ioc_guid {:016x}",
    .named.id_ext(),
    .named.guid(),
    .ours.id_ext(),
    .ours.guid()
)]
pub struct OtherTargetPort {
    /// The target port ID in the login.
    pub named: srp::wire::PortId,
    /// This port's target port ID.
    pub ours: srp::wire::PortId,
}

impl Inner {
    /// The P_Key table index for a login in `pkey`, and the P_Key there
    /// (see [`PortOptions::pkeys`]).
    pub(super) fn pkey_index(&self, pkey: Option<Pkey>) -> Result<(u16, Pkey), SetupError> {
        let served = &self.opts.pkeys;
        let table = match self.provider.query_port(self.ca, self.opts.port) {
            Ok(p) => p.pkeys,
            // Nothing to choose from: index 0, as before partitions.
            Err(_) if pkey.is_none() && served.is_empty() => Vec::new(),
            Err(e) => return Err(verbs_err("query port")(e)),
        };
        if pkey.is_none() && served.is_empty() {
            return Ok((0, table.first().copied().unwrap_or(Pkey::DEFAULT)));
        }
        let same = |a: Pkey, b: Pkey| a.is_valid() && a.base() == b.base();
        let at = |i: usize| u16::try_from(i).ok().map(|ix| (ix, table[i]));
        let Some(k) = pkey else {
            // No partition named: the first served one the table holds.
            let Some(s) = served.iter().find(|s| table.iter().any(|t| same(*t, **s))) else {
                return Err(PartitionError::NoneServed {
                    table,
                    served: served.clone(),
                }
                .into());
            };
            let i = table
                .iter()
                .position(|t| t == s)
                .or_else(|| table.iter().position(|t| same(*t, *s)));
            return i
                .and_then(at)
                .ok_or_else(|| PartitionError::LeftTable(*s).into());
        };
        if !served.is_empty() && !served.iter().any(|s| same(*s, k)) {
            return Err(PartitionError::NotServed {
                pkey: k,
                served: served.clone(),
            }
            .into());
        }
        // IBA 10.9.3: the entry must match the REQ's key (same partition,
        // one side a full member); a full entry matches every member, so
        // it goes first (as Linux ib_find_cached_pkey prefers it).
        let i = table
            .iter()
            .position(|t| t.is_full() && t.matches(k))
            .or_else(|| table.iter().position(|t| t.matches(k)));
        if let Some(r) = i.and_then(at) {
            return Ok(r);
        }
        Err(if table.iter().any(|t| same(*t, k)) {
            PartitionError::BothLimited { pkey: k, table }
        } else {
            PartitionError::NotMember { pkey: k, table }
        }
        .into())
    }

    pub(super) fn login(
        &self,
        data: &[u8],
        form: LoginForm,
        peer: PeerQp,
        pkey: Option<Pkey>,
    ) -> LoginOutcome {
        let outcome = self.log_in(data, form, peer, pkey);
        if let LoginOutcome::Rejected { reason, .. } = &outcome {
            tracing::debug!(port = %self.name, %reason, "login refused");
        }
        outcome
    }

    fn log_in(
        &self,
        data: &[u8],
        form: LoginForm,
        peer: PeerQp,
        pkey: Option<Pkey>,
    ) -> LoginOutcome {
        let mut st = self.lock();
        if let Some(refused) = self.refuse_pending(&mut st, data, form, peer) {
            return refused;
        }
        let conn = ConnId(st.next_conn);
        st.next_conn += 1;
        let (channel, rsp, terminated) = match st.target.login_private_data(data, form) {
            Login::Accepted {
                channel,
                rsp,
                terminated,
            } => (channel, rsp, terminated),
            Login::Rejected(rej) => {
                // A login for another target port (an initiator that still
                // has an old id_ext/ioc_guid, say) is told apart in the log.
                let req = match form {
                    LoginForm::IbCm => srp::wire::LoginReq::parse(data),
                    LoginForm::RdmaCm => srp::wire::LoginReq::parse_rdma(data),
                };
                let ours = st.target.config().target_port_id;
                let other_port = req
                    .ok()
                    .map(|r| r.target_port_id)
                    .filter(|named| {
                        rej.reason == LoginRejReason::UnableAssociateChannel && *named != ours
                    })
                    .map(|named| OtherTargetPort { named, ours });
                return LoginOutcome::Rejected {
                    reason: LoginRefusal::Srp {
                        reason: rej.reason,
                        detail: st.target.last_refusal().map(str::to_string),
                        other_port,
                    },
                    rej: rej_bytes(&rej),
                };
            }
        };
        let (initiator, sq) = {
            let ch = st.target.channel(channel).expect("channel just created");
            (initiator_name(&ch.nexus().0), st.target.config().sq_size)
        };
        let slot_size = st.target.config().max_rsp_size;
        let created = self.pkey_index(pkey).and_then(|(ix, key)| {
            self.create_conn(conn, peer, ix, sq, slot_size, &initiator)
                .map(|(c, local)| (c, local, key))
        });
        match created {
            Ok((mut c, local, key)) => {
                c.channel = channel;
                c.pkey = key;
                tracing::debug!(
                    parent: &c.span,
                    pkey = format_args!("{:04x}", key.0),
                    "login accepted"
                );
                st.by_channel.insert(channel, conn);
                st.conns.insert(conn, c);
                // Its credits' receive buffers, before it can use them.
                if let Err(e) = self.post_recv_goal(&mut st) {
                    tracing::warn!("posting receive buffers for a login: {e}");
                }
                // The poll thread times the login from now.
                let _ = self.events.lock().map(|tx| tx.send(Event::Timer));
                for t in terminated {
                    if let Some(&tc) = st.by_channel.get(&t) {
                        self.pump(&mut st, tc);
                    }
                }
                let mut b = vec![0u8; rsp.buffer_len()];
                let n = rsp.emit(&mut b).expect("buffer sized by buffer_len");
                b.truncate(n);
                LoginOutcome::Accepted {
                    conn,
                    local,
                    rsp: b,
                }
            }
            Err(e) => {
                st.target.remove(channel);
                let rej = LoginRej {
                    reason: LoginRejReason::UnableEstablishChannel,
                    tag: rsp.tag,
                    buf_fmt: rsp.buf_fmt,
                };
                LoginOutcome::Rejected {
                    reason: LoginRefusal::Channel(e),
                    rej: rej_bytes(&rej),
                }
            }
        }
    }

    /// The bounds on unfinished logins (accepted, no RTU yet), checked
    /// before a login creates anything: one initiator port may have
    /// `max_pending_per_initiator` (beyond: refused, INSUFFICIENT
    /// RESOURCES), the port `max_pending_logins` (beyond: the oldest
    /// unfinished login is dropped, so a flood of half-open logins from
    /// many ports cannot keep a good initiator out, whose login finishes
    /// within a round trip). Also refuses a REQ that lets the target no
    /// RDMA READ.
    pub(super) fn refuse_pending(
        &self,
        st: &mut State,
        data: &[u8],
        form: LoginForm,
        peer: PeerQp,
    ) -> Option<LoginOutcome> {
        let req = match form {
            LoginForm::IbCm => srp::wire::LoginReq::parse(data),
            LoginForm::RdmaCm => srp::wire::LoginReq::parse_rdma(data),
        }
        .ok()?;
        let refuse = |reason: LoginRefusal| {
            let rej = LoginRej {
                reason: LoginRejReason::InsufficientResources,
                tag: req.tag,
                buf_fmt: st.target.config().buf_formats,
            };
            Some(LoginOutcome::Rejected {
                reason,
                rej: rej_bytes(&rej),
            })
        };
        if peer.initiator_depth == 0 {
            return refuse(LoginRefusal::NoRdmaRead);
        }
        let name = initiator_name(&req.initiator_port_id);
        let pending: Vec<(std::time::Instant, ConnId, bool)> = st
            .conns
            .iter()
            .filter(|(_, c)| c.phase() == ChannelPhase::Pending)
            .map(|(id, c)| (c.accepted_at, *id, c.initiator == name))
            .collect();
        let mine = pending.iter().filter(|p| p.2).count();
        let per = self.opts.max_pending_per_initiator;
        if mine >= per {
            return refuse(LoginRefusal::TooManyPending {
                pending: mine,
                limit: per,
            });
        }
        let limit = self.opts.max_pending_logins;
        if pending.len() >= limit {
            if let Some(&(_, oldest, _)) = pending.iter().min() {
                self.drop_channel(st, oldest, CloseReason::LoginEvicted { limit });
            }
        }
        None
    }

    /// Creates the QP, its send CQ and send slots, and connects the QP.
    /// On an error, what it made so far is released.
    pub(super) fn create_conn(
        &self,
        conn: ConnId,
        peer: PeerQp,
        pkey_index: u16,
        sq: u32,
        slot_size: u32,
        initiator: &str,
    ) -> Result<(Conn, LocalQp), SetupError> {
        let p = &self.provider;
        let mut undo = Undo::new(p);
        let send_cq = p
            .create_cq(self.pd, &CqInit { cqe: sq + 2 }, conn.0)
            .map_err(verbs_err("create send CQ"))?;
        undo.push(move |p| drop(p.destroy_cq(send_cq)));
        let qp = p
            .create_qp(
                self.pd,
                &QpInit {
                    qp_type: QpType::Rc,
                    send_cq,
                    recv_cq: self.recv_cq,
                    srq: Some(self.srq),
                    caps: QpCaps {
                        // One beyond the channel's own for a keepalive.
                        max_send_wr: sq + 1,
                        max_recv_wr: 0,
                        // A WRITE out of reserved chunks may span two.
                        max_send_sge: 2,
                        max_recv_sge: 1,
                        max_inline: 0,
                    },
                    // Every request is signaled but the data-in WRITEs out
                    // of a memory store (see `Conn::unsignaled`).
                    sq_sig_all: false,
                    port: None,
                },
                conn.0,
            )
            .map_err(verbs_err("create QP"))?;
        undo.push(move |p| drop(p.destroy_qp(qp)));
        let send_buf = MemBuf::new((sq * super::slot_stride(slot_size)) as usize);
        let send_mr = undo.reg_local(self.pd, &send_buf, "register send slots")?;
        let psn = peer
            .local_psn
            .unwrap_or_else(|| Psn::new((conn.0 as u32).wrapping_mul(0x9e37_79b9) >> 8));
        self.connect_qp(qp, peer, pkey_index, psn)?;
        p.req_notify_cq(send_cq, false)
            .map_err(verbs_err("arm send CQ"))?;
        let qpn = p.qp_num(qp).map_err(verbs_err("QP number"))?;
        undo.disarm();
        let nexus = scsi::Nexus::new(initiator, &self.name);
        // A root span: a login that arrives inside someone else's span
        // (an in-process initiator's) does not make the channel part of it.
        let span = tracing::info_span!(
            parent: None,
            "srp_channel",
            port = %self.name,
            conn = conn.0,
            initiator = %initiator,
        );
        Ok((
            Conn {
                channel: ChannelId(0),
                route: scsi::Route::default(),
                qp,
                send_cq,
                send_buf,
                send_mr,
                slot_size,
                free_slots: (0..sq).rev().collect(),
                outstanding: 0,
                queued_wrs: 0,
                slot_seq: vec![0; sq as usize],
                unsignaled: VecDeque::new(),
                closing: false,
                initiator: initiator.to_string(),
                pkey: Pkey::DEFAULT,
                nexus,
                ops: Default::default(),
                fetched: IdMap::default(),
                spilled: IdMap::default(),
                data_in: Default::default(),
                queued: Default::default(),
                parked: IdMap::default(),
                established: false,
                accepted_at: self.now(),
                activity: 0,
                activity_seen: 0,
                keepalive_out: false,
                keepalives: 0,
                close_reason: None,
                span,
            },
            LocalQp { qpn, psn },
        ))
    }

    pub(super) fn connect_qp(
        &self,
        qp: QpHandle,
        peer: PeerQp,
        pkey_index: u16,
        psn: Psn,
    ) -> Result<(), SetupError> {
        let p = &self.provider;
        let port = self.opts.port;
        p.modify_qp(
            qp,
            &QpAttr {
                state: Some(QpState::Init),
                port: Some(port),
                pkey_index: Some(pkey_index),
                access: Some(AccessFlags::NONE),
                ..Default::default()
            },
        )
        .map_err(verbs_err("QP to INIT"))?;
        p.modify_qp(
            qp,
            &QpAttr {
                state: Some(QpState::Rtr),
                av: Some(AhAttr {
                    dlid: peer.lid,
                    port,
                    grh: true,
                    dgid: peer.gid,
                    sgid_index: self.opts.sgid_index,
                    sl: 0,
                    hop_limit: 64,
                }),
                path_mtu: Some(peer.mtu),
                dest_qpn: Some(peer.qpn),
                rq_psn: Some(psn),
                max_dest_rd_atomic: Some(0),
                min_rnr_timer: Some(12),
                ..Default::default()
            },
        )
        .map_err(verbs_err("QP to RTR"))?;
        p.modify_qp(
            qp,
            &QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(peer.psn),
                timeout: Some(peer.ack_timeout.clamp(14, 31)),
                retry_cnt: Some(7),
                rnr_retry: Some(7),
                max_rd_atomic: Some(peer.initiator_depth),
                ..Default::default()
            },
        )
        .map_err(verbs_err("QP to RTS"))?;
        Ok(())
    }

    /// When the poll thread must look at the channels next: the oldest
    /// pending login's timeout, and the next keepalive sweep while any
    /// channel is established. `None`: nothing to time.
    pub(super) fn next_deadline(&self) -> Option<std::time::Instant> {
        let st = self.lock();
        let pending = st
            .conns
            .values()
            .filter(|c| !c.established && !c.closing)
            .map(|c| c.accepted_at + self.opts.login_timeout)
            .min();
        let sweep = self.opts.keepalive.and_then(|k| {
            st.conns
                .values()
                .any(|c| c.established && !c.closing)
                .then_some(st.last_sweep + k)
        });
        pending.into_iter().chain(sweep).min()
    }

    /// Closes logins that were not established in time, and sends a
    /// keepalive on every established channel that had no completion
    /// since the last sweep.
    pub(super) fn on_timer(&self) {
        let now = self.now();
        let mut st = self.lock();
        let timeout = self.opts.login_timeout;
        let late: Vec<ConnId> = st
            .conns
            .iter()
            .filter(|(_, c)| !c.established && !c.closing && now >= c.accepted_at + timeout)
            .map(|(id, _)| *id)
            .collect();
        for conn in late {
            self.drop_channel(&mut st, conn, CloseReason::LoginTimeout(timeout));
        }
        let Some(every) = self.opts.keepalive else {
            return;
        };
        if now < st.last_sweep + every {
            return;
        }
        st.last_sweep = now;
        let idle: Vec<ConnId> = st
            .conns
            .iter_mut()
            .filter_map(|(id, c)| {
                let idle = c.established
                    && !c.closing
                    && !c.keepalive_out
                    && c.outstanding == 0
                    && c.activity == c.activity_seen;
                c.activity_seen = c.activity;
                idle.then_some(*id)
            })
            .collect();
        for conn in idle {
            self.send_keepalive(&mut st, conn);
        }
    }

    /// A zero-length RDMA WRITE: no memory is touched at either end (IBA
    /// C9-88: no R_Key is checked), but the initiator's NIC must
    /// acknowledge it, so it completes in error if the initiator is gone.
    pub(super) fn send_keepalive(&self, st: &mut State, conn: ConnId) {
        let Some(c) = st.conns.get_mut(&conn) else {
            return;
        };
        let mut wr = SendWr::new(KIND_KEEPALIVE, SendOpcode::RdmaWrite, Vec::new());
        wr.remote = RemoteAddr {
            addr: 0,
            rkey: rdma_types::Rkey(0),
        };
        if self.provider.post_send(c.qp, &[wr]).is_ok() {
            c.outstanding += 1;
            c.keepalive_out = true;
            c.keepalives += 1;
        }
    }

    /// Closes a channel for a reason of the port's own (not the SRP
    /// channel's): the channel is told the connection is lost and, once
    /// its work requests drained, the disconnect hook runs with `why`.
    pub(super) fn drop_channel(&self, st: &mut State, conn: ConnId, why: CloseReason) {
        let Some(c) = st.conns.get_mut(&conn) else {
            return;
        };
        if c.closing || c.close_reason.is_some() {
            return;
        }
        c.close_reason = Some(why);
        let channel = c.channel;
        if let Some(ch) = st.target.channel_mut(channel) {
            ch.connection_lost();
        }
        self.pump(st, conn);
    }

    /// Why the target is closing `conn`: the port's own reason if it has
    /// one, else what the SRP channel did.
    pub(super) fn close_reason(&self, st: &State, conn: ConnId) -> CloseReason {
        let c = st.conns.get(&conn);
        if let Some(r) = c.and_then(|c| c.close_reason.clone()) {
            return r;
        }
        let stats = c
            .and_then(|c| st.target.channel(c.channel))
            .map(|ch| ch.stats())
            .unwrap_or_default();
        match stats.logout_reason {
            Some(r) => CloseReason::TargetLogout(r),
            None if stats.initiator_logout => CloseReason::InitiatorLogout,
            None => CloseReason::WorkRequestFailed {
                status: WcStatus::GeneralErr,
                what: "a work request",
            },
        }
    }

    /// Moves the QP to ERROR so every posted work request flushes; the
    /// channel is released once they have.
    pub(super) fn close(&self, st: &mut State, conn: ConnId) {
        let Some(c) = st.conns.get_mut(&conn) else {
            return;
        };
        if !c.closing {
            c.closing = true;
            let _ = self.provider.modify_qp(
                c.qp,
                &QpAttr {
                    state: Some(QpState::Err),
                    ..Default::default()
                },
            );
        }
        self.maybe_finish(st, conn);
    }

    pub(super) fn maybe_finish(&self, st: &mut State, conn: ConnId) {
        let Some(c) = st.conns.get(&conn) else {
            return;
        };
        if !c.closing || c.outstanding > 0 {
            return;
        }
        let channel = c.channel;
        if let Some(ch) = st.target.channel_mut(channel) {
            ch.disconnected();
        }
        // Last outputs: aborts and releases.
        while let Some(out) = st
            .target
            .channel_mut(channel)
            .and_then(|ch| ch.poll_output())
        {
            if let Output::Abort(cmd) = out {
                if let Some(c) = st.conns.get(&conn) {
                    c.abort_unstarted(cmd);
                }
            }
            if let Output::Release(cmd) = out {
                if let Some(c) = st.conns.get_mut(&conn) {
                    if let Some(d) = c.data_in.remove(&cmd) {
                        st.free_chunks.extend_from_slice(d.chunks());
                    }
                    c.spilled.remove(&cmd);
                    if let Some(chunks) = c.fetched.remove(&cmd) {
                        st.free_chunks
                            .extend(chunks.into_iter().map(|(_, ch, _)| ch));
                    }
                }
            }
        }
        st.target.remove(channel);
        st.by_channel.remove(&channel);
        let c = st.conns.remove(&conn).expect("checked above");
        st.free_chunks
            .extend(c.ops.values().filter_map(|o| o.chunk));
        st.free_chunks
            .extend(c.data_in.values().flat_map(|d| d.chunks().iter().copied()));
        st.free_chunks.extend(c.parked.values().flatten().copied());
        st.free_chunks.extend(
            c.fetched
                .values()
                .flat_map(|v| v.iter().map(|&(_, ch, _)| ch)),
        );
        st.waiting.retain(|(w, _)| *w != conn);
        // Its per-initiator device pools: their queues close, their
        // threads end once the jobs queued there are done.
        st.dev_jobs.retain(|(_, owner), _| *owner != Some(conn));
        let p = &self.provider;
        let _ = p.destroy_qp(c.qp);
        let _ = p.dereg_mr(c.send_mr.handle);
        let _ = p.destroy_cq(c.send_cq);
        tracing::debug!(parent: &c.span, "channel released");
    }
}
