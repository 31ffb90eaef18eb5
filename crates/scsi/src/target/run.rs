//! One command run: the CDB checked against the nexus and the LU, the
//! commands the target answers itself (REPORT LUNS, unit attentions), the
//! rest handed to the device.

use super::*;

impl Target {
    /// Runs one command once the task manager has let it start.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run(
        &self,
        nexus: &Nexus,
        lun: Lun,
        route: Option<&Route>,
        cdb: &[u8],
        data_out: &[u8],
        expected: u64,
        mut bufs: Option<&mut Buffers<'_, '_>>,
    ) -> ScsiResponse {
        let parsed = Command::parse(cdb);
        if let (Ok((_, cmd @ (Command::Read { .. } | Command::Write { .. }))), Some(r)) =
            (&parsed, route)
        {
            if let Some(dev) = r.device().filter(|_| r.plain_for(self, nexus, lun)) {
                return self.run_plain(dev, nexus, cmd, cdb, data_out, expected, bufs);
            }
        }
        let mut st = self.lock();
        let rtpi = st.port_id(&nexus.target_port);
        let (tpgs, port_group) = st.alua_inquiry(rtpi);
        let dev = st
            .set_for(&nexus.initiator, &nexus.target_port)
            .get(&lun)
            .cloned();
        if let Some(d) = dev.as_ref().filter(|d| d.pass_through_handler().is_some()) {
            // A pass-through unit's commands go to the device, but those
            // the core keeps: REPORT LUNS, persistent reservations, and
            // REQUEST SENSE of a pending unit attention.
            let keeps = match cdb.first() {
                Some(0xa0 | 0x5e | 0x5f) => true,
                Some(0x03) => !st.ua_mut(nexus, lun).is_empty(),
                // REPORT and SET TARGET PORT GROUPS: the groups are the
                // target's, when it has any.
                Some(0xa3 | 0xa4) => {
                    cdb.get(1).is_some_and(|b| b & 0x1f == 0x0a) && !st.alua.groups.is_empty()
                }
                _ => false,
            };
            if !keeps {
                let d = d.clone();
                let port = crate::passthrough::PortView {
                    rtpi,
                    tpgs,
                    group: port_group,
                };
                return self.run_passed(st, nexus, lun, &d, port, cdb, data_out, expected, bufs);
            }
        }
        if let Some(d) = dev.as_ref().filter(|d| d.vcdrom_handler().is_some()) {
            // A virtual CD-ROM answers its MMC commands; the core keeps
            // REPORT LUNS, REQUEST SENSE, persistent reservations and the
            // target port groups, as for a pass-through unit.
            let keeps = match cdb.first() {
                Some(0xa0 | 0x5e | 0x5f | 0x03) => true,
                Some(0xa3 | 0xa4) => {
                    cdb.get(1).is_some_and(|b| b & 0x1f == 0x0a) && !st.alua.groups.is_empty()
                }
                _ => false,
            };
            if !keeps {
                let d = d.clone();
                let port = crate::passthrough::PortView {
                    rtpi,
                    tpgs,
                    group: port_group,
                };
                return self.run_cdrom(st, nexus, lun, &d, port, cdb, expected, bufs);
            }
        }
        let cmd = match parsed {
            Ok((_, c)) => c,
            Err(s) => return ScsiResponse::check(s, expected),
        };
        let bs = dev.as_ref().map_or(512, |d| d.block_size());
        let d_sense = dev.as_ref().is_some_and(|d| d.mode_state().d_sense);
        if let Err(s) = naca_supported(dev.as_deref(), cdb) {
            return ScsiResponse {
                descriptor_sense: d_sense,
                ..ScsiResponse::check(s, expected)
            };
        }
        let result = match (&cmd, dev) {
            (Command::ReportLuns { select, .. }, _) => {
                let luns: Vec<Lun> = st
                    .set_for(&nexus.initiator, &nexus.target_port)
                    .keys()
                    .copied()
                    .collect();
                if dev_known(&st, nexus, lun) {
                    st.ua_mut(nexus, lun).clear(Asc::REPORTED_LUNS_DATA_CHANGED);
                }
                report_luns(*select, &luns)
            }
            (Command::RequestSense { desc, .. }, dev) => {
                // SPC-4 6.29: a pending unit attention is reported (and
                // cleared) as the parameter data.
                let sense = match dev {
                    None => Sense::new(SenseKey::IllegalRequest, Asc::LOGICAL_UNIT_NOT_SUPPORTED),
                    Some(_) => match st.ua_mut(nexus, lun).pop() {
                        Some(asc) => Sense::new(SenseKey::UnitAttention, asc),
                        None => Sense::new(SenseKey::NoSense, Asc::NO_ADDITIONAL),
                    },
                };
                Ok(if *desc {
                    sense.to_descriptor()
                } else {
                    sense.to_fixed()
                })
            }
            (Command::Inquiry { evpd: false, .. }, None) => {
                // SPC-4 6.6.2: peripheral qualifier 011b, type 1Fh for a LUN
                // that is not mapped.
                let mut d = vec![0u8; 36];
                d[0] = 0x7f;
                d[2] = 0x06;
                d[3] = 0x02;
                d[4] = 31;
                Ok(d)
            }
            (_, None) => Err(Sense::new(
                SenseKey::IllegalRequest,
                Asc::LOGICAL_UNIT_NOT_SUPPORTED,
            )),
            (cmd, Some(dev)) => {
                let ua = st.ua_mut(nexus, lun);
                // INQUIRY is never blocked by a unit attention (SAM-5 5.14).
                let blocked = !matches!(cmd, Command::Inquiry { .. });
                let pending = if blocked { ua.pop() } else { None };
                let alua = match pending {
                    Some(_) => None,
                    None => st.alua_command(nexus, rtpi, cmd, cdb, data_out),
                };
                match (pending, alua) {
                    (Some(asc), _) => Err(Sense::new(SenseKey::UnitAttention, asc)),
                    (None, Some(answer)) => answer,
                    (None, None) => {
                        let ports = match cmd {
                            Command::PrIn { .. } | Command::PrOut { .. } => st.ports.clone(),
                            _ => BTreeMap::new(),
                        };
                        // REGISTER AND MOVE: whether the initiator its
                        // TransportID names reaches this LU at all.
                        let move_dest_sees_lu = match cmd {
                            Command::PrOut { sa: 7, .. } => data_out
                                .get(24..)
                                .and_then(|b| TransportId::parse(b).ok())
                                .is_none_or(|(id, _)| {
                                    st.set_for(&id.initiator_name(), &nexus.target_port)
                                        .values()
                                        .any(|d| Arc::ptr_eq(d, &dev))
                                }),
                            _ => true,
                        };
                        drop(st);
                        let env = crate::pr::PrEnv {
                            ports: &ports,
                            ptpl_capable: dev.config.pr_file.is_some(),
                            move_dest_sees_lu,
                        };
                        let conflict = ScsiResponse {
                            descriptor_sense: d_sense,
                            ..ScsiResponse::status_only(Status::ReservationConflict, expected)
                        };
                        match cmd {
                            Command::PrIn { sa, .. } => dev.pr_state().pr_in(*sa, env),
                            Command::PrOut {
                                sa,
                                type_byte,
                                param_len,
                            } => {
                                let p = data_out.get(..*param_len as usize).unwrap_or(data_out);
                                let (r, lost) = dev.with_pr_mut(|pr| {
                                    let r = pr.pr_out(nexus, *sa, *type_byte, p, env);
                                    let lost = r.is_ok() && dev.persist_pr(pr).is_err();
                                    (r, lost)
                                });
                                if lost {
                                    // SPC-4 5.9.5: the state could not be kept; say so.
                                    return ScsiResponse::check(
                                        Sense::new(SenseKey::HardwareError, Asc::WRITE_ERROR),
                                        expected,
                                    );
                                }
                                match r {
                                    Ok(notices) => {
                                        if *sa == 5 {
                                            // PREEMPT AND ABORT: the preempted nexuses'
                                            // tasks on this LU are aborted (SPC-4 5.9.11.5).
                                            let victims: Vec<&Nexus> =
                                                notices.iter().map(|(n, _)| n).collect();
                                            self.tasks
                                                .lock()
                                                .unwrap_or_else(|e| e.into_inner())
                                                .abort(|n, l, _| l == lun && victims.contains(&n));
                                            // ... and their ACA condition ends
                                            // (SPC-4 5.12.11.2.6).
                                            let k = lu_key(&dev);
                                            self.clear_aca(false, |key, a| {
                                                key == k && victims.contains(&&a.faulted)
                                            });
                                        }
                                        for (n, asc) in notices {
                                            self.raise_where(&dev, asc, |x| *x == n);
                                        }
                                        Ok(Vec::new())
                                    }
                                    Err(PrError::Conflict) => return conflict,
                                    Err(PrError::Check(s)) => Err(s),
                                }
                            }
                            _ => {
                                if dev.pr_conflicts(nexus, cmd) {
                                    return conflict;
                                }
                                let before = dev.mode_state();
                                let mut r =
                                    dev.execute_into(cmd, cdb, data_out, bufs.as_deref_mut());
                                match (cmd, &mut r) {
                                    (
                                        Command::Inquiry {
                                            page: 0x83,
                                            evpd: true,
                                            ..
                                        },
                                        Ok(d),
                                    ) => {
                                        add_relative_port(d, rtpi);
                                        if let Some(g) = port_group {
                                            crate::alua::add_group_designator(d, g);
                                        }
                                    }
                                    // SPC-4 6.6.2: TPGS, byte 5 bits 5..4.
                                    (Command::Inquiry { evpd: false, .. }, Ok(d)) => {
                                        if let Some(b) = d.get_mut(5) {
                                            *b |= tpgs << 4;
                                        }
                                    }
                                    _ => {}
                                }
                                if dev.mode_state() != before {
                                    // SPC-4 6.9: other nexuses learn of the change.
                                    self.raise_where(&dev, Asc::MODE_PARAMETERS_CHANGED, |x| {
                                        x != nexus
                                    });
                                }
                                r
                            }
                        }
                    }
                }
            }
        };
        respond(&cmd, bs, d_sense, result, data_out, expected, bufs)
    }

    /// [`Target::run`] for a READ or WRITE through a current, plain route
    /// to `dev` (see [`Route`]): what is left of the run once the route
    /// answered for the maps, unit attentions and group states.
    #[allow(clippy::too_many_arguments)]
    fn run_plain(
        &self,
        dev: &Arc<Device>,
        nexus: &Nexus,
        cmd: &Command,
        cdb: &[u8],
        data_out: &[u8],
        expected: u64,
        mut bufs: Option<&mut Buffers<'_, '_>>,
    ) -> ScsiResponse {
        let d_sense = dev.mode_state().d_sense;
        if let Err(s) = naca_supported(Some(dev), cdb) {
            return ScsiResponse {
                descriptor_sense: d_sense,
                ..ScsiResponse::check(s, expected)
            };
        }
        if dev.pr_conflicts(nexus, cmd) {
            return ScsiResponse {
                descriptor_sense: d_sense,
                ..ScsiResponse::status_only(Status::ReservationConflict, expected)
            };
        }
        let result = dev.execute_into(cmd, cdb, data_out, bufs.as_deref_mut());
        respond(
            cmd,
            dev.block_size(),
            d_sense,
            result,
            data_out,
            expected,
            bufs,
        )
    }
}

/// The response to `cmd` from what it gave: its data (moved into the
/// transport's buffers when it has them) and residual, or its sense.
#[allow(clippy::too_many_arguments)]
fn respond(
    cmd: &Command,
    bs: u32,
    d_sense: bool,
    result: Result<Vec<u8>, Sense>,
    data_out: &[u8],
    expected: u64,
    bufs: Option<&mut Buffers<'_, '_>>,
) -> ScsiResponse {
    match result {
        Err(s) => ScsiResponse {
            descriptor_sense: d_sense,
            ..ScsiResponse::check(s, expected)
        },
        Ok(mut data) => {
            let plan = cmd.plan(bs);
            let moved = match plan.dir {
                DataDir::In => {
                    let room = plan.len.min(expected);
                    data.truncate(room as usize);
                    match bufs {
                        // Pieces to copy into, or data placed already
                        // (read into the pieces, or by reference).
                        Some(bufs) if bufs.has_data_in() || bufs.placed.is_some() => {
                            if bufs.placed.is_none() {
                                bufs.copy_in(&data);
                                data = Vec::new();
                            }
                            (bufs.placed() as u64).min(room)
                        }
                        _ => data.len() as u64,
                    }
                }
                DataDir::Out => {
                    let pieces = bufs.as_ref().map_or(0, |b| b.data_out_len());
                    plan.len.min(expected).min((data_out.len() + pieces) as u64)
                }
                DataDir::None => 0,
            };
            ScsiResponse {
                status: Status::Good,
                sense: None,
                device_sense: None,
                data_in: data,
                residual: Residual::of(expected, plan.len, moved),
                descriptor_sense: d_sense,
            }
        }
    }
}

/// What the core answers for a unit it does not emulate (pass-through,
/// vcdrom) before the unit sees the command: a pending unit attention
/// (never for INQUIRY, SAM-5 5.14), then the port's group state refusing
/// what it does not serve (SPC-4 5.16.2.4). `None`: the unit runs it.
fn unit_gate(
    st: &mut State,
    nexus: &Nexus,
    lun: Lun,
    rtpi: u16,
    cdb: &[u8],
    expected: u64,
) -> Option<ScsiResponse> {
    if cdb.first() != Some(&0x12) {
        if let Some(asc) = st.ua_mut(nexus, lun).pop() {
            return Some(ScsiResponse::check(
                Sense::new(SenseKey::UnitAttention, asc),
                expected,
            ));
        }
    }
    match st.alua.group_of(rtpi).map(|g| g.state.admit(cdb)) {
        Some(Err(s)) => Some(ScsiResponse::check(s, expected)),
        _ => None,
    }
}

impl Target {
    /// Runs a command of a pass-through unit the core does not keep (see
    /// [`crate::passthrough`]): unit attentions and reservations first,
    /// then the device.
    #[allow(clippy::too_many_arguments)]
    fn run_passed(
        &self,
        mut st: MutexGuard<'_, State>,
        nexus: &Nexus,
        lun: Lun,
        dev: &Arc<Device>,
        port: crate::passthrough::PortView,
        cdb: &[u8],
        data_out: &[u8],
        expected: u64,
        bufs: Option<&mut Buffers<'_, '_>>,
    ) -> ScsiResponse {
        let Some(handler) = dev.pass_through_handler() else {
            return ScsiResponse::check(
                Sense::new(SenseKey::IllegalRequest, Asc::LOGICAL_UNIT_NOT_SUPPORTED),
                expected,
            );
        };
        if let Err(s) = naca_supported(Some(dev), cdb) {
            return ScsiResponse::check(s, expected);
        }
        // SPC-2 RESERVE/RELEASE(6/10): the emulated units do not have
        // them either, and the device must not hold a reservation of the
        // target's (every initiator would share it).
        if matches!(cdb.first(), Some(0x16 | 0x17 | 0x56 | 0x57)) {
            return ScsiResponse::check(
                Sense::new(
                    SenseKey::IllegalRequest,
                    Asc::INVALID_COMMAND_OPERATION_CODE,
                ),
                expected,
            );
        }
        if let Some(refused) = unit_gate(&mut st, nexus, lun, port.rtpi, cdb, expected) {
            return refused;
        }
        drop(st);
        let dir = match crate::passthrough::transfer(data_out, bufs.as_deref(), expected) {
            Ok((dir, _)) => dir,
            Err(s) => return ScsiResponse::check(s, expected),
        };
        if dev.pr_conflicts_passed(nexus, cdb, dir == DataDir::In) {
            return ScsiResponse::status_only(Status::ReservationConflict, expected);
        }
        let passed = handler.run(dev, port, cdb, data_out, bufs, expected);
        if let Some(asc) = passed.unit_attention {
            // What the device told this nexus, the others learn too.
            self.raise_where(dev, asc, |x| x != nexus);
        }
        dev.count_passed(passed.response.status);
        passed.response
    }
}

impl Target {
    /// Runs a command of a virtual CD-ROM unit the core does not keep
    /// (see [`crate::vcdrom`]): unit attentions, the port's ALUA state and
    /// reservations first, then the drive.
    #[allow(clippy::too_many_arguments)]
    fn run_cdrom(
        &self,
        mut st: MutexGuard<'_, State>,
        nexus: &Nexus,
        lun: Lun,
        dev: &Arc<Device>,
        port: crate::passthrough::PortView,
        cdb: &[u8],
        expected: u64,
        bufs: Option<&mut Buffers<'_, '_>>,
    ) -> ScsiResponse {
        let Some(cd) = dev.vcdrom_handler() else {
            return ScsiResponse::check(
                Sense::new(SenseKey::IllegalRequest, Asc::LOGICAL_UNIT_NOT_SUPPORTED),
                expected,
            );
        };
        if let Err(s) = naca_supported(Some(dev), cdb) {
            return ScsiResponse::check(s, expected);
        }
        if let Some(refused) = unit_gate(&mut st, nexus, lun, port.rtpi, cdb, expected) {
            return refused;
        }
        drop(st);
        if dev.pr_conflicts_passed(nexus, cdb, expected > 0) {
            return ScsiResponse::status_only(Status::ReservationConflict, expected);
        }
        let alloc = usize::try_from(expected).unwrap_or(usize::MAX);
        let mut data = match cd.execute(dev, cdb, alloc) {
            Ok(d) => d,
            Err(s) => return ScsiResponse::check(s, expected),
        };
        match crate::passthrough::inquiry_page(cdb) {
            Some(Some(0x83)) => {
                add_relative_port(&mut data, port.rtpi);
                if let Some(g) = port.group {
                    crate::alua::add_group_designator(&mut data, g);
                }
                data.truncate(alloc);
            }
            Some(None) => {
                if let Some(b) = data.get_mut(5) {
                    *b |= port.tpgs << 4;
                }
            }
            _ => {}
        }
        // A READ asking for more than the transport expects overflows
        // (its data is cut); other data was cut at the allocation length.
        let wanted = data.len() as u64;
        data.truncate(alloc);
        let moved = data.len() as u64;
        let wanted = if crate::vcdrom::is_read(cdb) {
            wanted
        } else {
            moved
        };
        let data = match bufs {
            Some(b) if b.has_data_in() => {
                b.copy_in(&data);
                Vec::new()
            }
            _ => data,
        };
        ScsiResponse {
            status: Status::Good,
            sense: None,
            device_sense: None,
            data_in: data,
            residual: Residual::of(expected, wanted, moved),
            descriptor_sense: false,
        }
    }
}

/// WRITE(6/10/12/16): the commands whose data-out the store takes in
/// pieces ([`Buffers::data_out`]).
pub(super) fn is_write(cdb: &[u8]) -> bool {
    matches!(cdb.first(), Some(0x0a | 0x2a | 0xaa | 0x8a))
}

/// READ(6/10/12/16) and WRITE(6/10/12/16), by operation code.
pub(super) fn is_read_or_write(cdb: &[u8]) -> bool {
    matches!(cdb.first(), Some(0x08 | 0x28 | 0xa8 | 0x88)) || is_write(cdb)
}

/// NACA=1 needs a logical unit with NormACA (SAM-5 5.3, SPC-4 6.6.2);
/// otherwise the CONTROL byte's bit 2 is an invalid field.
pub(super) fn naca_supported(dev: Option<&Device>, cdb: &[u8]) -> Result<(), Sense> {
    match control_byte(cdb) {
        Some((at, c)) if c & 0x04 != 0 && !dev.is_some_and(|d| d.config.norm_aca) => {
            Err(Sense::invalid_field(at as u16, Some(2)))
        }
        _ => Ok(()),
    }
}

/// Appends the relative target port designator of the nexus's port to
/// device identification VPD data (SPC-4 7.8.6.6: association 01b target
/// port, type 4, PIV 0), so an initiator learns the identifier REGISTER AND
/// MOVE takes.
pub(crate) fn add_relative_port(page: &mut Vec<u8>, rtpi: u16) {
    page.extend_from_slice(&[0x01, 0x14, 0x00, 0x04, 0, 0]);
    page.extend_from_slice(&rtpi.to_be_bytes());
    let len = (page.len().saturating_sub(4)).min(0xffff) as u16;
    if let Some(h) = page.get_mut(2..4) {
        h.copy_from_slice(&len.to_be_bytes());
    }
}

pub(super) fn dev_known(st: &State, nexus: &Nexus, lun: Lun) -> bool {
    st.set_for(&nexus.initiator, &nexus.target_port)
        .contains_key(&lun)
}

/// SPC-4 6.33 REPORT LUNS parameter data. SELECT REPORT 0, 1 (well-known:
/// none here, so empty) and 2 are accepted.
pub(super) fn report_luns(select: u8, luns: &[Lun]) -> Result<Vec<u8>, Sense> {
    let list: &[Lun] = match select {
        0 | 2 => luns,
        1 => &[],
        _ => return Err(Sense::invalid_field(2, None)),
    };
    let mut d = ((list.len() * 8) as u32).to_be_bytes().to_vec();
    d.extend_from_slice(&[0; 4]);
    for l in list {
        d.extend_from_slice(&l.encode());
    }
    Ok(d)
}
