//! SRP_TSK_MGMT (SRP r16a 6.7).

use super::{check_emit, check_opcode, IuType, Lun, Result, Tag};

/// Length of SRP_TSK_MGMT (`struct srp_tsk_mgmt`).
pub const TSK_MGMT_LEN: usize = 48;

rdma_types::open_enum! {
    /// TASK MANAGEMENT FUNCTION (SRP r16a 6.7, `SRP_TSK_*`).
    pub enum TmFunc(u8), "unknown task management function" {
        /// ABORT TASK (the task named by the task tag).
        AbortTask = 0x01 => "ABORT TASK",
        /// ABORT TASK SET.
        AbortTaskSet = 0x02 => "ABORT TASK SET",
        /// CLEAR TASK SET.
        ClearTaskSet = 0x04 => "CLEAR TASK SET",
        /// LOGICAL UNIT RESET.
        LogicalUnitReset = 0x08 => "LOGICAL UNIT RESET",
        /// CLEAR ACA.
        ClearAca = 0x40 => "CLEAR ACA",
    }
}

mod field {
    use core::ops::Range;
    // struct srp_tsk_mgmt, SRP r16a 6.7.
    pub const OPCODE: Range<usize> = 0..1;
    pub const SOL_NOT: Range<usize> = 1..2;
    pub const TAG: Range<usize> = 8..16;
    pub const LUN: Range<usize> = 20..28;
    pub const FUNC: Range<usize> = 30..31;
    pub const TASK_TAG: Range<usize> = 32..40;
}

rdma_types::view! {
    /// View of SRP_TSK_MGMT.
    pub struct TskMgmtPacket; len TSK_MGMT_LEN; "SRP_TSK_MGMT", crate::wire::need => crate::wire::Error;
    /// IU type code (0x01).
    opcode / set_opcode: u8 = field::OPCODE;
    /// Solicited notification bits.
    sol_not / set_sol_not: u8 = field::SOL_NOT;
    /// Tag of this request.
    tag / set_tag: super::Tag = field::TAG;
    /// Logical unit number.
    lun / set_lun: super::Lun = field::LUN;
    /// Function code.
    tsk_mgmt_func / set_tsk_mgmt_func: u8 = field::FUNC;
    /// TAG OF TASK TO BE MANAGED (ABORT TASK).
    task_tag / set_task_tag: super::Tag = field::TASK_TAG;
}

/// SRP_TSK_MGMT (SRP r16a 6.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TskMgmt {
    /// Solicited notification bits.
    pub sol_not: u8,
    /// Tag of this request.
    pub tag: Tag,
    /// Logical unit number.
    pub lun: Lun,
    /// Function.
    pub func: TmFunc,
    /// Task to abort (ABORT TASK); zero otherwise as Linux sends it.
    pub task_tag: Tag,
}

impl TskMgmt {
    /// Parse.
    ///
    /// # Errors
    /// [`Error::WrongOpcode`](super::Error::WrongOpcode),
    /// [`Error::Truncated`](super::Error::Truncated).
    pub fn parse(buf: &[u8]) -> Result<TskMgmt> {
        check_opcode(buf, IuType::TskMgmt)?;
        let p = TskMgmtPacket::new_checked(buf)?;
        Ok(TskMgmt {
            sol_not: p.sol_not(),
            tag: p.tag(),
            lun: p.lun(),
            func: p.tsk_mgmt_func().into(),
            task_tag: p.task_tag(),
        })
    }

    /// Bytes [`TskMgmt::emit`] writes (48).
    pub fn buffer_len(&self) -> usize {
        TSK_MGMT_LEN
    }

    /// Write the IU.
    ///
    /// # Errors
    /// [`Error::BufferTooShort`](super::Error::BufferTooShort).
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        check_emit(buf, TSK_MGMT_LEN)?;
        let buf = &mut buf[..TSK_MGMT_LEN];
        buf.fill(0);
        let mut p = TskMgmtPacket::new_unchecked(buf);
        p.set_opcode(IuType::TskMgmt.into());
        p.set_sol_not(self.sol_not);
        p.set_tag(self.tag);
        p.set_lun(self.lun);
        p.set_tsk_mgmt_func(self.func.into());
        p.set_task_tag(self.task_tag);
        Ok(TSK_MGMT_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abort_task_vector() {
        #[rustfmt::skip]
        let bytes: [u8; 48] = [
            0x01, // opcode SRP_TSK_MGMT
            0x00, // sol_not
            0, 0, 0, 0, 0, 0, // reserved
            0x00, 0x00, 0x00, 0x80, 0, 0, 0, 0, // tag: Linux SRP_TAG_TSK_MGMT (1 << 31)
            0, 0, 0, 0, // reserved
            0x00, 0x02, 0, 0, 0, 0, 0, 0, // LUN 2
            0, 0, // reserved
            0x01, // ABORT TASK
            0, // reserved
            0x2c, 0, 0, 0, 0, 0, 0, 0, // task tag 0x2c
            0, 0, 0, 0, 0, 0, 0, 0, // reserved
        ];
        let t = TskMgmt::parse(&bytes).unwrap();
        assert_eq!(t.func, TmFunc::AbortTask);
        assert_eq!(t.tag, Tag(1 << 31));
        assert_eq!(t.task_tag, Tag(0x2c));
        assert_eq!(t.lun.to_u64(), 0x0002_0000_0000_0000);
        let mut out = [0xaa; 48];
        assert_eq!(t.emit(&mut out), Ok(48));
        assert_eq!(out, bytes);
    }

    #[test]
    fn every_function_code_and_unknown() {
        let codes = [
            (0x01, "ABORT TASK"),
            (0x02, "ABORT TASK SET"),
            (0x04, "CLEAR TASK SET"),
            (0x08, "LOGICAL UNIT RESET"),
            (0x40, "CLEAR ACA"),
        ];
        for (v, name) in codes {
            let f = TmFunc::from(v);
            assert_eq!(f.to_string(), name);
            assert_eq!(u8::from(f), v);
        }
        assert_eq!(TmFunc::from(0x10), TmFunc::Unknown(0x10));
        assert_eq!(
            TmFunc::from(0x10).to_string(),
            "unknown task management function 0x10"
        );
    }
}
