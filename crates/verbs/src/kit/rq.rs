//! Receive queue and shared receive queue with the limit event
//! (IBA 11.5.2.3: when the count of posted WRs drops below the armed limit
//! the SRQ raises `SrqLimitReached` once and disarms).

use crate::types::RecvWr;
use crate::VerbsError;
use std::collections::VecDeque;

/// A bounded FIFO of receive WRs.
#[derive(Debug)]
pub struct RecvQueue {
    max_wr: usize,
    max_sge: usize,
    queue: VecDeque<RecvWr>,
    limit: u32,
}

impl RecvQueue {
    /// A queue of `max_wr` WRs of at most `max_sge` SGEs.
    pub fn new(max_wr: u32, max_sge: u32) -> RecvQueue {
        RecvQueue {
            max_wr: max_wr as usize,
            max_sge: max_sge as usize,
            queue: VecDeque::new(),
            limit: 0,
        }
    }

    /// Posts a batch; `BadWr{index}` on the first WR that does not fit.
    pub fn post(&mut self, wrs: &[RecvWr]) -> Result<(), VerbsError> {
        for (index, wr) in wrs.iter().enumerate() {
            let cause = if wr.sges.len() > self.max_sge {
                VerbsError::InvalidArgument(format!(
                    "{} SGEs > max {}",
                    wr.sges.len(),
                    self.max_sge
                ))
            } else if self.queue.len() >= self.max_wr {
                VerbsError::QueueFull
            } else {
                self.queue.push_back(wr.clone());
                continue;
            };
            return Err(VerbsError::BadWr {
                index,
                cause: Box::new(cause),
            });
        }
        Ok(())
    }

    /// Takes the oldest WR; the flag says the limit event must be raised.
    #[inline]
    pub fn take(&mut self) -> Option<(RecvWr, bool)> {
        let wr = self.queue.pop_front()?;
        let fire = self.limit > 0 && (self.queue.len() as u32) < self.limit;
        if fire {
            self.limit = 0;
        }
        Some((wr, fire))
    }

    /// Whether a WR is available.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Number of posted WRs.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Removes every WR (flush on QP error).
    pub fn drain(&mut self) -> Vec<RecvWr> {
        self.queue.drain(..).collect()
    }

    /// Arms the limit (0 disarms). Refused if above `max_wr`.
    pub fn set_limit(&mut self, limit: u32) -> Result<(), VerbsError> {
        if limit as usize > self.max_wr {
            return Err(VerbsError::InvalidArgument(format!(
                "SRQ limit {limit} > max_wr {}",
                self.max_wr
            )));
        }
        self.limit = limit;
        Ok(())
    }

    /// Current limit.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Capacity.
    pub fn max_wr(&self) -> u32 {
        self.max_wr as u32
    }

    /// SGE capacity.
    pub fn max_sge(&self) -> u32 {
        self.max_sge as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wr(id: u64) -> RecvWr {
        RecvWr {
            wr_id: id,
            sges: crate::sges![],
        }
    }

    #[test]
    fn full_queue_reports_index() {
        let mut q = RecvQueue::new(2, 1);
        let e = q.post(&[wr(1), wr(2), wr(3)]).unwrap_err();
        assert_eq!(
            e,
            VerbsError::BadWr {
                index: 2,
                cause: Box::new(VerbsError::QueueFull)
            }
        );
        assert_eq!(q.len(), 2);
        assert_eq!(q.take().unwrap().0.wr_id, 1);
    }

    #[test]
    fn limit_fires_once_when_below() {
        let mut q = RecvQueue::new(8, 1);
        q.post(&[wr(1), wr(2), wr(3), wr(4)]).unwrap();
        assert!(q.set_limit(9).is_err());
        q.set_limit(3).unwrap();
        assert!(!q.take().unwrap().1, "3 left, not below 3");
        assert!(q.take().unwrap().1, "2 left: fires");
        assert!(!q.take().unwrap().1, "disarmed");
        assert_eq!(q.limit(), 0);
    }
}
