//! Unit attention conditions per I_T nexus and LUN (SAM-5 5.14, SPC-4 5.13):
//! queued oldest first, a condition already pending is not queued twice,
//! each is reported once.

use crate::sense::Asc;
use std::collections::VecDeque;

#[derive(Debug, Default, Clone)]
pub struct UaQueue {
    pending: VecDeque<Asc>,
}

impl UaQueue {
    pub fn push(&mut self, asc: Asc) {
        if asc == Asc::POWER_ON_RESET {
            // A reset supersedes everything reported before it (SAM-5 5.14).
            self.pending.clear();
        }
        if !self.pending.contains(&asc) {
            self.pending.push_back(asc);
        }
    }

    pub fn pop(&mut self) -> Option<Asc> {
        self.pending.pop_front()
    }

    /// Drops one condition (REPORT LUNS clears REPORTED LUNS DATA HAS
    /// CHANGED, SPC-4 6.33).
    pub fn clear(&mut self, asc: Asc) {
        self.pending.retain(|&a| a != asc);
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_dedup_reset() {
        let mut q = UaQueue::default();
        q.push(Asc::CAPACITY_DATA_CHANGED);
        q.push(Asc::REPORTED_LUNS_DATA_CHANGED);
        q.push(Asc::CAPACITY_DATA_CHANGED);
        assert_eq!(q.pop(), Some(Asc::CAPACITY_DATA_CHANGED));
        assert_eq!(q.pop(), Some(Asc::REPORTED_LUNS_DATA_CHANGED));
        assert_eq!(q.pop(), None);
        q.push(Asc::CAPACITY_DATA_CHANGED);
        q.push(Asc::POWER_ON_RESET);
        assert_eq!(q.pop(), Some(Asc::POWER_ON_RESET));
        assert!(q.is_empty());
    }
}
