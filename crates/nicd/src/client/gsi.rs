//! The client's GSI QPs: its places at the daemon's shared QP1 (see
//! [`crate::mads`]), served here so the access layer above runs as it
//! would over a QP1 of its own. A send on one is a
//! [`Request::GsiSend`](crate::proto::Request::GsiSend) of the MAD read
//! from the consumer's registered memory; a MAD the daemon hands over
//! ([`Event::Mad`](crate::proto::Event::Mad)) fills the next posted
//! receive (a 40-byte GRH, then the MAD) as a UD receive does. Their
//! completions wait here, in front of the CQ's own: `poll_cq` takes
//! them first, and an armed CQ's handler hears of them on the event
//! thread. A `wait_cq` does not wake for them (the access layer arms
//! and polls).

use rdma_types::{Gid, Lkey, QpState, Qpn, WcOpcode, WcStatus};
use std::collections::{HashMap, HashSet, VecDeque};
use verbs::{MemBuf, RecvWr, Sge, VerbsError, WcFlags, WorkCompletion};

/// One GSI QP's state on this side.
pub(super) struct Gsi {
    pub(super) ctx: u64,
    pub(super) send_cq: u32,
    pub(super) recv_cq: u32,
    pub(super) sig_all: bool,
    pub(super) state: QpState,
    pub(super) pkey_index: u16,
    pub(super) recvs: VecDeque<RecvWr>,
}

/// What the client serves itself, by the daemon's handle indices.
#[derive(Default)]
pub(super) struct Local {
    /// A PD's CA.
    pub(super) pds: HashMap<u32, u32>,
    /// A CQ's CA and context.
    pub(super) cqs: HashMap<u32, (u32, u64)>,
    /// An AH's destination.
    pub(super) ahs: HashMap<u32, Gid>,
    /// Registrations: buffer, range, L_Key (MADs are read and written
    /// through them).
    pub(super) mrs: HashMap<u32, (MemBuf, u64, u64, Lkey)>,
    pub(super) gsis: HashMap<u32, Gsi>,
    /// Completions of GSI QPs not polled yet, by CQ.
    pub(super) done: HashMap<u32, VecDeque<WorkCompletion>>,
    /// CQs armed since their handler last heard.
    pub(super) armed: HashSet<u32>,
    /// MADs dropped for want of a posted receive.
    pub(super) overruns: u64,
}

impl Local {
    /// The buffer and offset of `[addr, addr+len)` under `lkey`.
    fn place(&self, s: &Sge) -> Option<(&MemBuf, usize)> {
        self.mrs.values().find_map(|(buf, addr, len, lkey)| {
            let inside = *lkey == s.lkey
                && s.addr >= *addr
                && (s.addr - addr)
                    .checked_add(u64::from(s.length))
                    .is_some_and(|e| e <= *len)
                && buf.contains(s.addr, u64::from(s.length));
            inside.then(|| (buf, (s.addr - buf.addr()) as usize))
        })
    }

    /// The bytes a send's gather list names (at most `max`).
    pub(super) fn gather(&self, sges: &[Sge], max: usize) -> Result<Vec<u8>, VerbsError> {
        let mut out = Vec::new();
        for s in sges {
            let Some((buf, off)) = self.place(s) else {
                return Err(VerbsError::InvalidArgument(format!(
                    "a GSI send's data at {:#x} (+{}) lies in no registration of L_Key {:#x}",
                    s.addr, s.length, s.lkey.0
                )));
            };
            let mut b = vec![0; s.length as usize];
            buf.read_at(off, &mut b);
            out.extend_from_slice(&b);
            if out.len() > max {
                return Err(VerbsError::InvalidArgument(format!(
                    "a MAD is at most {max} bytes; this send gathers more"
                )));
            }
        }
        Ok(out)
    }

    /// Scatters `data` over a receive's list; how many bytes it took.
    fn scatter(&self, sges: &[Sge], data: &[u8]) -> Option<usize> {
        let mut at = 0;
        for s in sges {
            if at == data.len() {
                break;
            }
            let (buf, off) = self.place(s)?;
            let n = (s.length as usize).min(data.len() - at);
            buf.write_at(off, &data[at..at + n]);
            at += n;
        }
        Some(at)
    }

    /// A GSI completion on CQ `cq`.
    pub(super) fn push(&mut self, cq: u32, wc: WorkCompletion) {
        self.done.entry(cq).or_default().push_back(wc);
    }

    /// The CA and context of CQ `cq` if it is armed and has a GSI
    /// completion (it is disarmed).
    pub(super) fn notify(&mut self, cq: u32) -> Option<(u32, u64)> {
        let pending = self.done.get(&cq).is_some_and(|d| !d.is_empty());
        if pending && self.armed.remove(&cq) {
            return self.cqs.get(&cq).copied();
        }
        None
    }

    /// Takes up to `out.len()` GSI completions of CQ `cq`.
    pub(super) fn poll(&mut self, cq: u32, out: &mut [WorkCompletion]) -> usize {
        let Some(d) = self.done.get_mut(&cq) else {
            return 0;
        };
        let mut n = 0;
        while n < out.len() {
            let Some(wc) = d.pop_front() else { break };
            out[n] = wc;
            n += 1;
        }
        n
    }

    /// A MAD for GSI QP `qp` from `sgid`: into its next receive. The
    /// CQ's CA and context when its handler must hear.
    pub(super) fn receive(
        &mut self,
        qp: u32,
        sgid: Gid,
        pkey_index: u16,
        mad: &[u8],
    ) -> Option<(u32, u64)> {
        let g = self.gsis.get_mut(&qp)?;
        let Some(wr) = g.recvs.pop_front() else {
            self.overruns += 1;
            return None;
        };
        let (cq, ctx) = (g.recv_cq, g.ctx);
        let mut bytes = rdma_access::ud_grh(sgid).to_vec();
        bytes.extend_from_slice(mad);
        let (status, len) = match self.scatter(&wr.sges, &bytes) {
            Some(n) if n == bytes.len() => (WcStatus::Success, n),
            Some(_) => (WcStatus::LocLenErr, 0),
            None => (WcStatus::LocProtErr, 0),
        };
        let mut wc = WorkCompletion::new(wr.wr_id, status, WcOpcode::Recv, ctx);
        wc.byte_len = len as u32;
        wc.src_qp = Qpn::GSI;
        wc.pkey_index = pkey_index;
        wc.wc_flags = WcFlags::GRH;
        self.push(cq, wc);
        self.notify(cq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local_with_qp() -> (Local, MemBuf, Lkey) {
        let mut l = Local::default();
        let buf = MemBuf::new_private(4096);
        let lkey = Lkey(0x77);
        l.mrs.insert(1, (buf.clone(), buf.addr(), 4096, lkey));
        l.cqs.insert(5, (2, 0xc0));
        l.gsis.insert(
            9,
            Gsi {
                ctx: 0x99,
                send_cq: 5,
                recv_cq: 5,
                sig_all: true,
                state: QpState::Rts,
                pkey_index: 0,
                recvs: VecDeque::new(),
            },
        );
        (l, buf, lkey)
    }

    #[test]
    fn a_mad_fills_the_next_receive_behind_a_grh_as_a_nic_writes_it() {
        let (mut l, buf, lkey) = local_with_qp();
        // A receive cut in two pieces: the GRH and part of the MAD, then the rest.
        let sges = vec![
            Sge {
                addr: buf.addr(),
                length: 100,
                lkey,
            },
            Sge {
                addr: buf.addr() + 1000,
                length: 196,
                lkey,
            },
        ];
        l.gsis.get_mut(&9).unwrap().recvs.push_back(RecvWr {
            wr_id: 42,
            sges: sges.into(),
        });
        let mad: Vec<u8> = (0..=255u8).collect();
        let v4 = Gid::from_ip([127, 91, 7, 7].into());
        // Not armed: nobody is told, the completion waits.
        assert_eq!(l.receive(9, v4, 3, &mad), None);
        let mut wcs = [WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0); 4];
        assert_eq!(l.poll(5, &mut wcs), 1);
        let wc = wcs[0];
        assert_eq!(
            (
                wc.wr_id,
                wc.status,
                wc.byte_len,
                wc.src_qp,
                wc.pkey_index,
                wc.qp_ctx
            ),
            (42, WcStatus::Success, 296, Qpn::GSI, 3, 0x99)
        );
        // RoCEv2 over IPv4: an IPv4 header in the GRH's last 20 bytes.
        assert_eq!(buf.to_vec(20, 1), vec![0x45]);
        assert_eq!(buf.to_vec(32, 4), vec![127, 91, 7, 7]);
        assert_eq!(buf.to_vec(40, 60), mad[..60].to_vec());
        assert_eq!(buf.to_vec(1000, 196), mad[60..].to_vec());
        // Armed, the next one tells the CQ's CA and context (once).
        let one = vec![Sge {
            addr: buf.addr() + 2000,
            length: 296,
            lkey,
        }];
        let g = l.gsis.get_mut(&9).unwrap();
        g.recvs.push_back(RecvWr {
            wr_id: 43,
            sges: one.clone().into(),
        });
        g.recvs.push_back(RecvWr {
            wr_id: 44,
            sges: one.into(),
        });
        l.armed.insert(5);
        assert_eq!(l.receive(9, v4, 0, &mad), Some((2, 0xc0)));
        assert_eq!(l.receive(9, v4, 0, &mad), None);
        assert_eq!(l.poll(5, &mut wcs), 2);
        // None posted: dropped and counted.
        assert_eq!(l.receive(9, v4, 0, &mad), None);
        assert_eq!(l.overruns, 1);
    }

    #[test]
    fn sends_gather_only_from_registered_memory() {
        let (l, buf, lkey) = local_with_qp();
        buf.write_at(8, &[1, 2, 3, 4]);
        let inside = Sge {
            addr: buf.addr() + 8,
            length: 4,
            lkey,
        };
        assert_eq!(l.gather(&[inside], 256).unwrap(), vec![1, 2, 3, 4]);
        let wrong_key = Sge {
            lkey: Lkey(1),
            ..inside
        };
        assert!(l.gather(&[wrong_key], 256).is_err());
        let past_end = Sge {
            addr: buf.addr() + 4090,
            length: 16,
            lkey,
        };
        assert!(l.gather(&[past_end], 256).is_err());
        let too_long = Sge {
            addr: buf.addr(),
            length: 300,
            lkey,
        };
        assert!(l.gather(&[too_long], 256).is_err());
    }
}
