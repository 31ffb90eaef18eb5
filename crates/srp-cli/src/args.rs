//! What the command lines of `srp` and `srpd` share beyond clap: Linux's
//! SRP transport timers as they are given (seconds, or with a unit, or
//! `off`).

use rdma_types::units::{self, DurationError};
use std::time::Duration;

/// One of scsi_transport_srp's timers (`reconnect_delay`,
/// `fast_io_fail_tmo`, `dev_loss_tmo`) as given on a command line: a
/// duration, where a plain number counts seconds as in Linux's sysfs
/// files (`10`, `500ms`, `2m`), or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tmo(pub Option<Duration>);

/// A timer that is neither a duration nor `off`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}, or `off`")]
pub struct TmoError(pub DurationError);

impl std::str::FromStr for Tmo {
    type Err = TmoError;
    fn from_str(s: &str) -> Result<Tmo, TmoError> {
        if s.trim() == "off" {
            return Ok(Tmo(None));
        }
        units::secs(s).map(|d| Tmo(Some(d))).map_err(TmoError)
    }
}

impl Tmo {
    /// The timer as the remote port takes it.
    pub fn rport(self) -> Option<rdma_types::Duration> {
        self.0.map(rdma_types::Duration::from_std)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_take_seconds_units_or_off() {
        assert_eq!("10".parse(), Ok(Tmo(Some(Duration::from_secs(10)))));
        assert_eq!("500ms".parse(), Ok(Tmo(Some(Duration::from_millis(500)))));
        assert_eq!("2m".parse(), Ok(Tmo(Some(Duration::from_secs(120)))));
        assert_eq!("off".parse(), Ok(Tmo(None)));
        let e = "never".parse::<Tmo>().unwrap_err().to_string();
        assert!(
            e.contains("`never` is not a duration")
                && e.contains("a number of seconds")
                && e.ends_with("or `off`"),
            "{e}"
        );
        assert_eq!(
            Tmo(Some(Duration::from_secs(15))).rport(),
            Some(rdma_types::Duration::from_secs(15))
        );
    }
}
