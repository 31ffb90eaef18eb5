//! The remote port state machine (Linux `scsi_transport_srp`, the FSM
//! proposed in the SRP initiator slides): `running` -> `blocked` on a
//! transport failure or DREQ -> `fail-fast` after `fast_io_fail_tmo` ->
//! `lost` after `dev_loss_tmo`, with reconnect attempts every
//! `reconnect_delay`. A reconnect that succeeds before `lost` returns to
//! `running`, and the block device keeps its identity throughout.
//!
//! One addition to Linux: [`Rport::port_active`]. A reconnect attempt
//! while the local port is DOWN fails at once (the session sends no login
//! into a dead port), so the next one would wait `reconnect_delay` after
//! the link is back; the port becoming ACTIVE again starts it at once
//! instead (or, when an attempt is running, right after it fails). The
//! three timers keep their Linux meaning: the event only moves an attempt
//! forward, and does nothing with `reconnect_delay` off.
//!
//! Sans-IO: feed [`Rport::transport_failed`], [`Rport::reconnect_done`],
//! [`Rport::port_active`] and [`Rport::handle_timeout`]; drain
//! [`Rport::poll_action`]; ask [`Rport::io_verdict`] for each new command.

use rdma_types::{Duration, Instant};
use thiserror::Error;

/// Timer settings; `None` means "off". Linux defaults: 10 s, 15 s, 600 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RportConfig {
    /// Delay between reconnect attempts.
    pub reconnect_delay: Option<Duration>,
    /// Time after a failure until I/O fails fast instead of waiting.
    pub fast_io_fail_tmo: Option<Duration>,
    /// Time after a failure until the port is given up.
    pub dev_loss_tmo: Option<Duration>,
}

impl Default for RportConfig {
    fn default() -> Self {
        RportConfig {
            reconnect_delay: Some(Duration::from_secs(10)),
            fast_io_fail_tmo: Some(Duration::from_secs(15)),
            dev_loss_tmo: Some(Duration::from_secs(600)),
        }
    }
}

/// A combination of timers Linux refuses (`srp_tmo_valid`).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RportConfigError {
    /// All three timers are off: a failed port would hang forever.
    #[error("reconnect_delay, fast_io_fail_tmo and dev_loss_tmo cannot all be off")]
    AllOff,
    /// `reconnect_delay` of zero would spin.
    #[error("reconnect_delay must be positive or off")]
    ZeroReconnectDelay,
    /// Blocking longer than the SCSI limit of 600 s.
    #[error("{0} must not exceed 600 s while I/O is blocked")]
    TooLong(&'static str),
    /// `fast_io_fail_tmo` must expire before `dev_loss_tmo`.
    #[error("fast_io_fail_tmo ({fast}) must be less than dev_loss_tmo ({loss})")]
    FastIoAfterDevLoss {
        /// fast_io_fail_tmo.
        fast: Duration,
        /// dev_loss_tmo.
        loss: Duration,
    },
}

/// The SCSI limit on how long a device may stay blocked.
const BLOCK_MAX: Duration = Duration::from_secs(600);

impl RportConfig {
    /// Checks the rules of `srp_tmo_valid`.
    ///
    /// # Errors
    /// The first rule broken.
    pub fn validate(&self) -> Result<(), RportConfigError> {
        if self.reconnect_delay.is_none()
            && self.fast_io_fail_tmo.is_none()
            && self.dev_loss_tmo.is_none()
        {
            return Err(RportConfigError::AllOff);
        }
        if self.reconnect_delay == Some(Duration::ZERO) {
            return Err(RportConfigError::ZeroReconnectDelay);
        }
        if self.fast_io_fail_tmo.is_some_and(|f| f > BLOCK_MAX) {
            return Err(RportConfigError::TooLong("fast_io_fail_tmo"));
        }
        if self.fast_io_fail_tmo.is_none() && self.dev_loss_tmo.is_some_and(|d| d > BLOCK_MAX) {
            return Err(RportConfigError::TooLong(
                "dev_loss_tmo without fast_io_fail_tmo",
            ));
        }
        if let (Some(fast), Some(loss)) = (self.fast_io_fail_tmo, self.dev_loss_tmo) {
            if fast >= loss {
                return Err(RportConfigError::FastIoAfterDevLoss { fast, loss });
            }
        }
        Ok(())
    }
}

/// Remote port states (`enum srp_rport_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RportState {
    /// Connected; I/O flows.
    Running,
    /// Transport failed; I/O is held while reconnecting.
    Blocked,
    /// `fast_io_fail_tmo` passed; I/O fails at once, reconnecting goes on.
    FailFast,
    /// `dev_loss_tmo` passed; the port is gone for good.
    Lost,
}

impl core::fmt::Display for RportState {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            RportState::Running => "running",
            RportState::Blocked => "blocked",
            RportState::FailFast => "fail-fast",
            RportState::Lost => "lost",
        })
    }
}

/// What the driver must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RportAction {
    /// Stop sending; hold new and queued commands.
    BlockIo,
    /// Try to reconnect now; report with [`Rport::reconnect_done`].
    Reconnect,
    /// Fail every held and in-flight command (transport fail-fast).
    FailIo,
    /// Connection restored: resend held commands, accept new ones.
    ResumeIo,
    /// Give the port up: fail everything and remove the device.
    Remove,
}

/// What to do with a new command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoVerdict {
    /// Send it.
    Send,
    /// Hold it until the port recovers or fails fast.
    Hold,
    /// Fail it now; the port may still come back.
    FailFast,
    /// Fail it now; the port is gone.
    Gone,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timer {
    Reconnect = 0,
    FastIoFail = 1,
    DevLoss = 2,
}

/// The state machine of one remote port.
#[derive(Debug)]
pub struct Rport {
    cfg: RportConfig,
    state: RportState,
    deadlines: [Option<Instant>; 3],
    reconnecting: bool,
    /// The port became ACTIVE while an attempt ran: if it fails, the next
    /// goes at once (that attempt may have found the port still DOWN).
    retry_now: bool,
    actions: std::collections::VecDeque<RportAction>,
    failures: u64,
    reconnects: u64,
}

impl Rport {
    /// A port in `running`.
    ///
    /// # Errors
    /// The timer combination is invalid.
    pub fn new(cfg: RportConfig) -> Result<Rport, RportConfigError> {
        cfg.validate()?;
        Ok(Rport {
            cfg,
            state: RportState::Running,
            deadlines: [None; 3],
            reconnecting: false,
            retry_now: false,
            actions: Default::default(),
            failures: 0,
            reconnects: 0,
        })
    }

    /// Current state.
    pub fn state(&self) -> RportState {
        self.state
    }

    /// Transport failures seen so far.
    pub fn failures(&self) -> u64 {
        self.failures
    }

    /// Successful reconnects so far.
    pub fn reconnects(&self) -> u64 {
        self.reconnects
    }

    fn arm(&mut self, t: Timer, at: Option<Instant>) {
        self.deadlines[t as usize] = at;
    }

    /// The transport failed (QP error, CM DREQ or a dead path).
    pub fn transport_failed(&mut self, now: Instant) {
        if self.state != RportState::Running {
            return;
        }
        self.failures += 1;
        self.state = RportState::Blocked;
        self.actions.push_back(RportAction::BlockIo);
        self.arm(
            Timer::FastIoFail,
            self.cfg.fast_io_fail_tmo.map(|d| now + d),
        );
        self.arm(Timer::DevLoss, self.cfg.dev_loss_tmo.map(|d| now + d));
        // The first attempt goes out at once; later ones wait reconnect_delay.
        if self.cfg.reconnect_delay.is_some() {
            self.reconnecting = true;
            self.actions.push_back(RportAction::Reconnect);
        }
    }

    /// The reconnect attempt asked for by [`RportAction::Reconnect`] ended.
    pub fn reconnect_done(&mut self, now: Instant, ok: bool) {
        if !self.reconnecting {
            return;
        }
        self.reconnecting = false;
        let retry_now = std::mem::take(&mut self.retry_now);
        match (ok, self.state) {
            (true, RportState::Blocked | RportState::FailFast) => {
                self.reconnects += 1;
                self.state = RportState::Running;
                self.deadlines = [None; 3];
                self.actions.push_back(RportAction::ResumeIo);
            }
            (false, RportState::Blocked | RportState::FailFast) if retry_now => {
                self.reconnecting = true;
                self.actions.push_back(RportAction::Reconnect);
            }
            (false, RportState::Blocked | RportState::FailFast) => {
                self.arm(Timer::Reconnect, self.cfg.reconnect_delay.map(|d| now + d));
            }
            _ => {}
        }
    }

    /// The local port of the path became ACTIVE (a link that came back).
    /// A blocked or failed-fast port tries to reconnect now instead of at
    /// its next `reconnect_delay`; one with an attempt running tries again
    /// as soon as that attempt fails. Nothing changes while running, once
    /// lost, or with `reconnect_delay` off (reconnecting is then not this
    /// state machine's job, as in Linux).
    pub fn port_active(&mut self) {
        if self.cfg.reconnect_delay.is_none()
            || !matches!(self.state, RportState::Blocked | RportState::FailFast)
        {
            return;
        }
        if self.reconnecting {
            self.retry_now = true;
            return;
        }
        self.arm(Timer::Reconnect, None);
        self.reconnecting = true;
        self.actions.push_back(RportAction::Reconnect);
    }

    /// The earliest deadline.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadlines.iter().flatten().min().copied()
    }

    /// Fires every deadline at or before `now`, in time order.
    pub fn handle_timeout(&mut self, now: Instant) {
        loop {
            let due = [Timer::DevLoss, Timer::FastIoFail, Timer::Reconnect]
                .into_iter()
                .filter_map(|t| {
                    self.deadlines[t as usize]
                        .filter(|&d| d <= now)
                        .map(|d| (d, t))
                })
                // At equal deadlines, giving up wins over failing fast,
                // which wins over another attempt.
                .min_by_key(|&(d, t)| (d, 2 - t as usize));
            let Some((_, timer)) = due else { return };
            self.deadlines[timer as usize] = None;
            match timer {
                Timer::FastIoFail if self.state == RportState::Blocked => {
                    self.state = RportState::FailFast;
                    self.actions.push_back(RportAction::FailIo);
                }
                Timer::DevLoss
                    if matches!(self.state, RportState::Blocked | RportState::FailFast) =>
                {
                    self.state = RportState::Lost;
                    self.deadlines = [None; 3];
                    self.reconnecting = false;
                    self.retry_now = false;
                    self.actions.push_back(RportAction::Remove);
                }
                Timer::Reconnect
                    if matches!(self.state, RportState::Blocked | RportState::FailFast)
                        && !self.reconnecting =>
                {
                    self.reconnecting = true;
                    self.actions.push_back(RportAction::Reconnect);
                }
                _ => {}
            }
        }
    }

    /// The next action for the driver.
    pub fn poll_action(&mut self) -> Option<RportAction> {
        self.actions.pop_front()
    }

    /// What to do with a new command in the current state.
    pub fn io_verdict(&self) -> IoVerdict {
        match self.state {
            RportState::Running => IoVerdict::Send,
            RportState::Blocked => IoVerdict::Hold,
            RportState::FailFast => IoVerdict::FailFast,
            RportState::Lost => IoVerdict::Gone,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Instant {
        Instant::from_millis(s * 1000)
    }

    fn drain(r: &mut Rport) -> Vec<RportAction> {
        std::iter::from_fn(|| r.poll_action()).collect()
    }

    /// Advances the port to `until`, firing deadlines in order and failing
    /// every reconnect attempt; returns (time, action) pairs.
    fn run_failing(r: &mut Rport, until: Instant) -> Vec<(Instant, RportAction)> {
        let mut log = Vec::new();
        while let Some(t) = r.poll_timeout().filter(|&t| t <= until) {
            r.handle_timeout(t);
            for a in drain(r) {
                log.push((t, a));
                if a == RportAction::Reconnect {
                    r.reconnect_done(t, false);
                }
            }
        }
        log
    }

    #[test]
    fn defaults_are_linux_defaults_and_valid() {
        let c = RportConfig::default();
        assert_eq!(c.reconnect_delay, Some(Duration::from_secs(10)));
        assert_eq!(c.fast_io_fail_tmo, Some(Duration::from_secs(15)));
        assert_eq!(c.dev_loss_tmo, Some(Duration::from_secs(600)));
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn invalid_timer_combinations() {
        let off = RportConfig {
            reconnect_delay: None,
            fast_io_fail_tmo: None,
            dev_loss_tmo: None,
        };
        assert_eq!(off.validate(), Err(RportConfigError::AllOff));
        let zero = RportConfig {
            reconnect_delay: Some(Duration::ZERO),
            ..Default::default()
        };
        assert_eq!(zero.validate(), Err(RportConfigError::ZeroReconnectDelay));
        let order = RportConfig {
            fast_io_fail_tmo: Some(Duration::from_secs(20)),
            dev_loss_tmo: Some(Duration::from_secs(20)),
            ..Default::default()
        };
        assert!(matches!(
            order.validate(),
            Err(RportConfigError::FastIoAfterDevLoss { .. })
        ));
        let long = RportConfig {
            fast_io_fail_tmo: None,
            dev_loss_tmo: Some(Duration::from_secs(601)),
            ..Default::default()
        };
        assert!(matches!(long.validate(), Err(RportConfigError::TooLong(_))));
        let fast_long = RportConfig {
            fast_io_fail_tmo: Some(Duration::from_secs(601)),
            dev_loss_tmo: None,
            ..Default::default()
        };
        assert!(matches!(
            fast_long.validate(),
            Err(RportConfigError::TooLong(_))
        ));
        assert!(Rport::new(off).is_err());
    }

    #[test]
    fn recovery_before_fast_io_fail_returns_to_running() {
        let mut r = Rport::new(RportConfig::default()).unwrap();
        assert_eq!(r.io_verdict(), IoVerdict::Send);
        r.transport_failed(secs(100));
        assert_eq!(r.state(), RportState::Blocked);
        assert_eq!(
            drain(&mut r),
            vec![RportAction::BlockIo, RportAction::Reconnect]
        );
        assert_eq!(r.io_verdict(), IoVerdict::Hold);
        r.reconnect_done(secs(101), false);
        assert_eq!(
            r.poll_timeout(),
            Some(secs(111)),
            "next attempt after reconnect_delay"
        );
        r.handle_timeout(secs(111));
        assert_eq!(drain(&mut r), vec![RportAction::Reconnect]);
        r.reconnect_done(secs(112), true);
        assert_eq!(r.state(), RportState::Running);
        assert_eq!(drain(&mut r), vec![RportAction::ResumeIo]);
        assert_eq!(r.poll_timeout(), None, "all timers cancelled");
        assert_eq!((r.failures(), r.reconnects()), (1, 1));
        // A second failure starts the timers afresh.
        r.transport_failed(secs(200));
        assert!(r.poll_timeout().is_some());
        assert_eq!(r.failures(), 2);
    }

    #[test]
    fn fail_fast_then_lost_with_reconnects_in_between() {
        let mut r = Rport::new(RportConfig::default()).unwrap();
        r.transport_failed(secs(0));
        let first = drain(&mut r);
        assert_eq!(first, vec![RportAction::BlockIo, RportAction::Reconnect]);
        r.reconnect_done(secs(0), false);
        let log = run_failing(&mut r, secs(1000));
        let fail_io: Vec<Instant> = log
            .iter()
            .filter(|(_, a)| *a == RportAction::FailIo)
            .map(|(t, _)| *t)
            .collect();
        let removed: Vec<Instant> = log
            .iter()
            .filter(|(_, a)| *a == RportAction::Remove)
            .map(|(t, _)| *t)
            .collect();
        let attempts = log
            .iter()
            .filter(|(_, a)| *a == RportAction::Reconnect)
            .count();
        assert_eq!(fail_io, vec![secs(15)]);
        assert_eq!(removed, vec![secs(600)]);
        assert_eq!(attempts, 59, "every 10 s from 10 s to 590 s");
        assert_eq!(r.state(), RportState::Lost);
        assert_eq!(r.io_verdict(), IoVerdict::Gone);
        assert_eq!(r.poll_timeout(), None);
        // Lost is terminal: a late reconnect success or failure changes nothing.
        r.reconnect_done(secs(700), true);
        r.transport_failed(secs(700));
        assert_eq!(r.state(), RportState::Lost);
        assert!(drain(&mut r).is_empty());
    }

    #[test]
    fn recovery_from_fail_fast() {
        let mut r = Rport::new(RportConfig::default()).unwrap();
        r.transport_failed(secs(0));
        drain(&mut r);
        r.reconnect_done(secs(0), false);
        run_failing(&mut r, secs(16));
        assert_eq!(r.state(), RportState::FailFast);
        assert_eq!(r.io_verdict(), IoVerdict::FailFast);
        r.handle_timeout(secs(20));
        assert_eq!(drain(&mut r), vec![RportAction::Reconnect]);
        r.reconnect_done(secs(21), true);
        assert_eq!(r.state(), RportState::Running);
        assert_eq!(drain(&mut r), vec![RportAction::ResumeIo]);
    }

    #[test]
    fn fast_io_fail_off_holds_until_dev_loss() {
        let cfg = RportConfig {
            fast_io_fail_tmo: None,
            dev_loss_tmo: Some(Duration::from_secs(60)),
            ..Default::default()
        };
        let mut r = Rport::new(cfg).unwrap();
        r.transport_failed(secs(0));
        drain(&mut r);
        r.reconnect_done(secs(0), false);
        let log = run_failing(&mut r, secs(100));
        assert!(log.iter().all(|(_, a)| *a != RportAction::FailIo));
        assert_eq!(log.last(), Some(&(secs(60), RportAction::Remove)));
    }

    #[test]
    fn reconnect_off_waits_for_timers_only() {
        let cfg = RportConfig {
            reconnect_delay: None,
            ..Default::default()
        };
        let mut r = Rport::new(cfg).unwrap();
        r.transport_failed(secs(0));
        assert_eq!(drain(&mut r), vec![RportAction::BlockIo]);
        let log = run_failing(&mut r, secs(1000));
        assert_eq!(
            log,
            vec![
                (secs(15), RportAction::FailIo),
                (secs(600), RportAction::Remove)
            ]
        );
    }

    #[test]
    fn dev_loss_off_keeps_reconnecting() {
        let cfg = RportConfig {
            dev_loss_tmo: None,
            ..Default::default()
        };
        let mut r = Rport::new(cfg).unwrap();
        r.transport_failed(secs(0));
        drain(&mut r);
        r.reconnect_done(secs(0), false);
        let log = run_failing(&mut r, secs(10_000));
        assert_eq!(r.state(), RportState::FailFast);
        assert_eq!(
            log.iter()
                .filter(|(_, a)| *a == RportAction::Reconnect)
                .count(),
            1000
        );
    }

    #[test]
    fn failure_while_blocked_is_ignored_and_success_without_attempt_too() {
        let mut r = Rport::new(RportConfig::default()).unwrap();
        r.reconnect_done(secs(0), true);
        assert_eq!(r.state(), RportState::Running);
        assert!(drain(&mut r).is_empty());
        r.transport_failed(secs(0));
        r.transport_failed(secs(1));
        assert_eq!(r.failures(), 1);
        assert_eq!(
            drain(&mut r),
            vec![RportAction::BlockIo, RportAction::Reconnect]
        );
    }

    #[test]
    fn port_active_moves_the_next_attempt_forward() {
        let mut r = Rport::new(RportConfig::default()).unwrap();
        r.transport_failed(secs(0));
        drain(&mut r);
        // The first attempt found the port DOWN and failed at once.
        r.reconnect_done(secs(0), false);
        assert_eq!(r.poll_timeout(), Some(secs(10)));
        r.handle_timeout(secs(3));
        assert!(drain(&mut r).is_empty(), "nothing before reconnect_delay");
        // The link is back 3 s later: an attempt now, not at 10 s.
        r.port_active();
        assert_eq!(drain(&mut r), vec![RportAction::Reconnect]);
        assert_eq!(
            r.poll_timeout(),
            Some(secs(15)),
            "the reconnect timer is cancelled; fast_io_fail_tmo and dev_loss_tmo run on"
        );
        // A second event while that attempt runs asks for nothing more.
        r.port_active();
        assert!(drain(&mut r).is_empty());
        r.reconnect_done(secs(4), true);
        assert_eq!(drain(&mut r), vec![RportAction::ResumeIo]);
        assert_eq!(r.state(), RportState::Running);
        assert_eq!(r.reconnects(), 1);
    }

    #[test]
    fn port_active_during_an_attempt_retries_right_after_it_fails() {
        let mut r = Rport::new(RportConfig::default()).unwrap();
        r.transport_failed(secs(0));
        drain(&mut r);
        // The attempt started while the port was DOWN; the port comes up
        // before it ends (failed).
        r.port_active();
        assert!(drain(&mut r).is_empty());
        r.reconnect_done(secs(1), false);
        assert_eq!(drain(&mut r), vec![RportAction::Reconnect]);
        assert_eq!(r.poll_timeout(), Some(secs(15)), "no reconnect timer");
        // That one fails too: back to reconnect_delay.
        r.reconnect_done(secs(2), false);
        assert!(drain(&mut r).is_empty());
        assert_eq!(r.poll_timeout(), Some(secs(12)));
    }

    #[test]
    fn port_active_keeps_the_linux_timers() {
        // Fail-fast still happens on time, and an attempt from fail-fast
        // may still restore the port.
        let mut r = Rport::new(RportConfig::default()).unwrap();
        r.transport_failed(secs(0));
        drain(&mut r);
        r.reconnect_done(secs(0), false);
        let log = run_failing(&mut r, secs(16));
        assert!(log.contains(&(secs(15), RportAction::FailIo)), "{log:?}");
        r.port_active();
        assert_eq!(drain(&mut r), vec![RportAction::Reconnect]);
        r.reconnect_done(secs(16), true);
        assert_eq!(r.state(), RportState::Running);
        assert_eq!(drain(&mut r), vec![RportAction::ResumeIo]);

        // Running, lost, or with reconnect_delay off: no attempt.
        r.port_active();
        assert!(drain(&mut r).is_empty());
        let mut off = Rport::new(RportConfig {
            reconnect_delay: None,
            ..Default::default()
        })
        .unwrap();
        off.transport_failed(secs(0));
        drain(&mut off);
        off.port_active();
        assert!(drain(&mut off).is_empty());
        assert_eq!(
            run_failing(&mut off, secs(1000)),
            vec![
                (secs(15), RportAction::FailIo),
                (secs(600), RportAction::Remove)
            ]
        );
        off.port_active();
        assert!(drain(&mut off).is_empty());
        assert_eq!(off.state(), RportState::Lost);
    }

    #[test]
    fn states_display_like_sysfs() {
        assert_eq!(RportState::FailFast.to_string(), "fail-fast");
        assert_eq!(RportState::Lost.to_string(), "lost");
    }
}
