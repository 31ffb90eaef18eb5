//! SRP_CMD (SRP r16a 6.8) with additional CDB bytes, direct and indirect
//! data buffer descriptors (SRP r16a 5.5), and SRP2 immediate data.

use super::{check_emit, check_len, check_opcode, Error, IuType, Lun, Result, Tag};
use rdma_types::Rkey;

/// Length of SRP_CMD before the additional CDB and descriptors
/// (`struct srp_cmd`).
pub const CMD_FIXED_LEN: usize = 48;
/// Length of a direct data buffer descriptor (`struct srp_direct_buf`).
pub const DIRECT_BUF_LEN: usize = 16;
/// Length of an indirect descriptor before its descriptor list
/// (`struct srp_indirect_buf`: table descriptor + total length).
pub const INDIRECT_BUF_HEADER_LEN: usize = 20;
/// Length of the SRP2 immediate data descriptor (`struct srp_imm_buf`).
pub const IMM_BUF_LEN: usize = 4;
/// Largest ADDITIONAL CDB LENGTH in bytes (6 bits of 4-byte words).
pub const MAX_ADD_CDB_LEN: usize = 63 * 4;
/// The immediate data offset Linux ib_srp asks for: SRP_CMD, 16 bytes of
/// additional CDB (so a 32-byte CDB fits) and the immediate data descriptor.
pub const LINUX_IMM_DATA_OFFSET: u16 = (CMD_FIXED_LEN + 16 + IMM_BUF_LEN) as u16;

rdma_types::open_enum! {
    /// A data buffer descriptor format nibble of SRP_CMD (SRP r16a;
    /// 3 is the SRP2 immediate data descriptor, `SRP_DATA_DESC_*`).
    pub enum DescFormat(u8), "descriptor format" {
        /// No data buffer descriptor.
        None = 0 => "no data",
        /// One direct data buffer descriptor.
        Direct = 1 => "direct",
        /// An indirect data buffer descriptor.
        Indirect = 2 => "indirect",
        /// SRP2 immediate data (data-out only).
        Immediate = 3 => "immediate",
    }
}

rdma_types::open_enum! {
    /// TASK ATTRIBUTE of SRP_CMD (SRP r16a table 21, Linux `ib_srpt.h`
    /// `SRP_CMD_*_Q`; iPXE's header gives ACA as 0x08, Linux 0x04).
    pub enum TaskAttr(u8), "task attribute" {
        /// SIMPLE.
        Simple = 0 => "simple",
        /// HEAD OF QUEUE.
        HeadOfQueue = 1 => "head of queue",
        /// ORDERED.
        Ordered = 2 => "ordered",
        /// ACA.
        Aca = 4 => "ACA",
    }
}

/// A direct data buffer descriptor (SRP r16a 5.5.2): one registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DirectBuf {
    /// Virtual address.
    pub va: u64,
    /// Memory key (R_Key on InfiniBand).
    pub key: Rkey,
    /// Length in bytes.
    pub len: u32,
}

impl DirectBuf {
    /// Read from the first 16 bytes of `b`.
    ///
    /// # Errors
    /// [`Error::Truncated`].
    pub fn parse(b: &[u8]) -> Result<DirectBuf> {
        check_len("direct buffer descriptor", b, DIRECT_BUF_LEN)?;
        Ok(DirectBuf {
            va: super::get_u64(b, 0..8),
            key: Rkey(super::get_u32(b, 8..12)),
            len: super::get_u32(b, 12..16),
        })
    }

    /// Write into the first 16 bytes of `b`.
    ///
    /// # Errors
    /// [`Error::BufferTooShort`].
    pub fn emit(&self, b: &mut [u8]) -> Result<usize> {
        check_emit(b, DIRECT_BUF_LEN)?;
        b[0..8].copy_from_slice(&self.va.to_be_bytes());
        b[8..12].copy_from_slice(&self.key.0.to_be_bytes());
        b[12..16].copy_from_slice(&self.len.to_be_bytes());
        Ok(DIRECT_BUF_LEN)
    }
}

/// A list of direct descriptors kept as validated wire bytes (a multiple of
/// 16) so parsing does not allocate. Also parses an external descriptor
/// table fetched from the initiator by RDMA READ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DescList<'a>(&'a [u8]);

impl<'a> DescList<'a> {
    /// Wrap wire bytes holding whole descriptors.
    ///
    /// # Errors
    /// [`Error::TableLen`] if the length is not a multiple of 16.
    pub fn new(bytes: &'a [u8]) -> Result<DescList<'a>> {
        if bytes.len() % DIRECT_BUF_LEN != 0 {
            return Err(Error::TableLen(
                u32::try_from(bytes.len()).unwrap_or(u32::MAX),
            ));
        }
        Ok(DescList(bytes))
    }

    /// Encode descriptors into `out` (cleared first), ready for [`DescList::new`].
    pub fn encode(descs: &[DirectBuf], out: &mut Vec<u8>) {
        out.clear();
        for d in descs {
            let mut b = [0u8; DIRECT_BUF_LEN];
            let _ = d.emit(&mut b);
            out.extend_from_slice(&b);
        }
    }

    /// Number of descriptors.
    pub fn len(&self) -> usize {
        self.0.len() / DIRECT_BUF_LEN
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The `i`-th descriptor.
    pub fn get(&self, i: usize) -> Option<DirectBuf> {
        let start = i.checked_mul(DIRECT_BUF_LEN)?;
        let b = self.0.get(start..start + DIRECT_BUF_LEN)?;
        DirectBuf::parse(b).ok()
    }

    /// All descriptors in order.
    pub fn iter(&self) -> impl Iterator<Item = DirectBuf> + 'a {
        self.0
            .chunks_exact(DIRECT_BUF_LEN)
            .filter_map(|c| DirectBuf::parse(c).ok())
    }

    /// The wire bytes.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.0
    }
}

/// An indirect data buffer descriptor (SRP r16a 5.5.3): where the whole
/// descriptor table lives, the total data length, and the part of the table
/// copied into the IU (all of it, or a prefix when the table is external).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndirectBuf<'a> {
    /// Location and byte length of the full descriptor table.
    pub table: DirectBuf,
    /// TOTAL LENGTH of data described.
    pub total_len: u32,
    /// The descriptors carried in the IU (count from the SRP_CMD count field).
    pub descs: DescList<'a>,
}

impl IndirectBuf<'_> {
    /// Number of descriptors in the full table.
    pub fn table_entries(&self) -> usize {
        self.table.len as usize / DIRECT_BUF_LEN
    }

    /// Whether the initiator must fetch (part of) the table by RDMA READ
    /// because the IU holds only a prefix of it.
    pub fn is_external(&self) -> bool {
        self.descs.len() < self.table_entries()
    }

    fn wire_len(&self) -> usize {
        INDIRECT_BUF_HEADER_LEN + self.descs.as_bytes().len()
    }
}

/// The data buffer descriptor of one direction of an SRP_CMD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataDesc<'a> {
    /// No data in this direction.
    None,
    /// One direct descriptor.
    Direct(DirectBuf),
    /// An indirect descriptor.
    Indirect(IndirectBuf<'a>),
    /// SRP2 immediate data (data-out only): the bytes at `offset` in the IU,
    /// located by a 4-byte length descriptor.
    Immediate {
        /// Immediate data offset agreed at login.
        offset: u16,
        /// The data.
        data: &'a [u8],
    },
}

impl DataDesc<'_> {
    /// The format nibble.
    pub fn format(&self) -> DescFormat {
        match self {
            DataDesc::None => DescFormat::None,
            DataDesc::Direct(_) => DescFormat::Direct,
            DataDesc::Indirect(_) => DescFormat::Indirect,
            DataDesc::Immediate { .. } => DescFormat::Immediate,
        }
    }

    /// Descriptor count field value Linux writes: the number of descriptors
    /// in the IU for indirect, zero otherwise.
    fn count(&self) -> u8 {
        match self {
            DataDesc::Indirect(i) => u8::try_from(i.descs.len()).unwrap_or(u8::MAX),
            _ => 0,
        }
    }

    /// Bytes of descriptor in the descriptor area.
    fn wire_len(&self) -> usize {
        match self {
            DataDesc::None => 0,
            DataDesc::Direct(_) => DIRECT_BUF_LEN,
            DataDesc::Indirect(i) => i.wire_len(),
            DataDesc::Immediate { .. } => IMM_BUF_LEN,
        }
    }

    /// Total data bytes described.
    pub fn data_len(&self) -> u64 {
        match self {
            DataDesc::None => 0,
            DataDesc::Direct(d) => u64::from(d.len),
            DataDesc::Indirect(i) => u64::from(i.total_len),
            DataDesc::Immediate { data, .. } => data.len() as u64,
        }
    }
}

mod field {
    use core::ops::Range;
    // struct srp_cmd, SRP r16a 6.8.
    pub const OPCODE: Range<usize> = 0..1;
    pub const SOL_NOT: Range<usize> = 1..2;
    pub const BUF_FMT: Range<usize> = 5..6;
    pub const DATA_OUT_DESC_CNT: Range<usize> = 6..7;
    pub const DATA_IN_DESC_CNT: Range<usize> = 7..8;
    pub const TAG: Range<usize> = 8..16;
    pub const LUN: Range<usize> = 20..28;
    pub const TASK_ATTR: Range<usize> = 29..30;
    pub const ADD_CDB_LEN: Range<usize> = 31..32;
    pub const CDB: Range<usize> = 32..48;
}

rdma_types::view! {
    /// View of SRP_CMD's fixed part.
    pub struct CmdPacket; len CMD_FIXED_LEN; "SRP_CMD", crate::wire::need => crate::wire::Error;
    /// IU type code (0x02).
    opcode / set_opcode: u8 = field::OPCODE;
    /// Solicited notification bits.
    sol_not / set_sol_not: u8 = field::SOL_NOT;
    /// Descriptor formats: data-out in the high nibble, data-in low.
    buf_fmt / set_buf_fmt: u8 = field::BUF_FMT;
    /// DATA-OUT BUFFER DESCRIPTOR COUNT.
    data_out_desc_cnt / set_data_out_desc_cnt: u8 = field::DATA_OUT_DESC_CNT;
    /// DATA-IN BUFFER DESCRIPTOR COUNT.
    data_in_desc_cnt / set_data_in_desc_cnt: u8 = field::DATA_IN_DESC_CNT;
    /// Tag.
    tag / set_tag: super::Tag = field::TAG;
    /// Logical unit number.
    lun / set_lun: super::Lun = field::LUN;
    /// Task attribute byte.
    task_attr / set_task_attr: u8 = field::TASK_ATTR;
    /// ADDITIONAL CDB LENGTH byte (4-byte words in bits 7:2).
    add_cdb_len / set_add_cdb_len: u8 = field::ADD_CDB_LEN;
}

impl<T: AsRef<[u8]>> CmdPacket<T> {
    /// Data-out descriptor format (high nibble of the format byte).
    pub fn data_out_format(&self) -> DescFormat {
        DescFormat::from(self.buf_fmt() >> 4)
    }
    /// Data-in descriptor format (low nibble).
    pub fn data_in_format(&self) -> DescFormat {
        DescFormat::from(self.buf_fmt() & 0x0f)
    }
    /// Additional CDB bytes that follow the 16-byte CDB field.
    pub fn add_cdb_bytes(&self) -> usize {
        usize::from(self.add_cdb_len() & 0xfc)
    }
    /// The 16-byte CDB field.
    pub fn cdb(&self) -> &[u8] {
        &self.buffer.as_ref()[field::CDB]
    }
}

/// SRP_CMD (SRP r16a 6.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cmd<'a> {
    /// Solicited notification bits (byte 1).
    pub sol_not: u8,
    /// Tag.
    pub tag: Tag,
    /// Logical unit number.
    pub lun: Lun,
    /// Task attribute.
    pub task_attr: TaskAttr,
    /// The CDB area: the 16-byte CDB field followed by any additional CDB
    /// bytes. A shorter slice is zero-padded to 16 on emit; a longer one to a
    /// multiple of 4.
    pub cdb: &'a [u8],
    /// Data-out descriptor (the first in the descriptor area).
    pub data_out: DataDesc<'a>,
    /// Data-in descriptor.
    pub data_in: DataDesc<'a>,
}

impl<'a> Cmd<'a> {
    /// Parse an SRP_CMD of exactly the received length. `imm_data_offset` is
    /// the offset agreed at login when immediate data was negotiated.
    /// Descriptor counts of direct descriptors are not kept (Linux sends 0);
    /// bytes after the last descriptor (or after the immediate data) are
    /// ignored, and so are the bytes between the immediate data descriptor
    /// and the immediate data offset (Linux ib_srp leaves whatever an earlier
    /// command put there; [`Cmd::emit`] writes zeros).
    ///
    /// # Errors
    /// [`Error::Truncated`] when a descriptor or the CDB runs past the IU,
    /// [`Error::DescFormat`] for a format this crate cannot decode,
    /// [`Error::TableLen`]/[`Error::TableCount`] for an inconsistent indirect
    /// descriptor, [`Error::ImmediateNotNegotiated`] and
    /// [`Error::ImmediateBounds`] for bad immediate data.
    pub fn parse(buf: &'a [u8], imm_data_offset: Option<u16>) -> Result<Cmd<'a>> {
        check_opcode(buf, IuType::Cmd)?;
        let p = CmdPacket::new_checked(buf)?;
        let cdb_end = CMD_FIXED_LEN + p.add_cdb_bytes();
        check_len("SRP_CMD additional CDB", buf, cdb_end)?;
        let mut at = cdb_end;
        let data_out = parse_desc(
            buf,
            &mut at,
            "data-out",
            p.data_out_format(),
            p.data_out_desc_cnt(),
        )?;
        let data_in = parse_desc(
            buf,
            &mut at,
            "data-in",
            p.data_in_format(),
            p.data_in_desc_cnt(),
        )?;
        let data_out = match data_out {
            Parsed::Desc(d) => d,
            Parsed::Imm(len) => {
                let offset = imm_data_offset.ok_or(Error::ImmediateNotNegotiated)?;
                let bounds = Error::ImmediateBounds {
                    offset,
                    len,
                    desc_end: at,
                    iu_len: buf.len(),
                };
                let start = usize::from(offset);
                let end = usize::try_from(len)
                    .ok()
                    .and_then(|l| start.checked_add(l))
                    .ok_or(bounds)?;
                if start < at || end > buf.len() {
                    return Err(bounds);
                }
                DataDesc::Immediate {
                    offset,
                    data: &buf[start..end],
                }
            }
        };
        let data_in = match data_in {
            Parsed::Desc(d) => d,
            Parsed::Imm(_) => {
                return Err(Error::DescFormat {
                    dir: "data-in",
                    format: DescFormat::Immediate.into(),
                })
            }
        };
        Ok(Cmd {
            sol_not: p.sol_not(),
            tag: p.tag(),
            lun: p.lun(),
            task_attr: TaskAttr::from(p.task_attr()),
            cdb: &buf[field::CDB.start..cdb_end],
            data_out,
            data_in,
        })
    }

    fn cdb_area_len(&self) -> Result<usize> {
        let n = self.cdb.len();
        if n <= 16 {
            Ok(16)
        } else if n - 16 <= MAX_ADD_CDB_LEN {
            Ok(16 + (n - 16).div_ceil(4) * 4)
        } else {
            Err(Error::CdbLen(n))
        }
    }

    fn desc_end(&self) -> usize {
        self.desc_end_after(self.cdb_area_len().unwrap_or(16))
    }

    /// [`Cmd::desc_end`] with the CDB area `cdb_area` bytes long.
    fn desc_end_after(&self, cdb_area: usize) -> usize {
        field::CDB.start + cdb_area + self.data_out.wire_len() + self.data_in.wire_len()
    }

    /// Bytes [`Cmd::emit`] writes: up to the end of the descriptors, or up to
    /// the end of the immediate data.
    pub fn buffer_len(&self) -> usize {
        match self.data_out {
            DataDesc::Immediate { offset, data } => {
                self.desc_end().max(usize::from(offset)) + data.len()
            }
            _ => self.desc_end(),
        }
    }

    /// Write the IU as Linux ib_srp would: reserved bytes and padding zero,
    /// descriptor counts zero except for indirect descriptors.
    ///
    /// # Errors
    /// [`Error::BufferTooShort`], [`Error::CdbLen`],
    /// [`Error::TooManyDescriptors`] (more than 255 in the IU), [`Error::DescFormat`]
    /// for immediate data-in, [`Error::ImmediateBounds`] when the immediate
    /// data offset lies inside the descriptors or the length overflows 32 bits.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let total = self.checked_len()?;
        check_emit(buf, total)?;
        let head = self.emit_head(&mut buf[..total])?;
        if let DataDesc::Immediate { data, .. } = self.data_out {
            buf[head..total].copy_from_slice(data);
        }
        Ok(total)
    }

    /// The emitted bytes in a new vector; the immediate data is appended,
    /// never zeroed first (a 4 KiB WRITE's IU is mostly its data).
    ///
    /// # Errors
    /// As [`Cmd::emit`].
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        self.encode_into(&mut v)?;
        Ok(v)
    }

    /// As [`Cmd::to_vec`], into `v`: cleared first, its room reused.
    ///
    /// # Errors
    /// As [`Cmd::emit`]; `v` is then empty.
    pub fn encode_into(&self, v: &mut Vec<u8>) -> Result<()> {
        self.encode_head_into(v)?;
        if let DataDesc::Immediate { data, .. } = self.data_out {
            v.extend_from_slice(data);
        }
        Ok(())
    }

    /// As [`Cmd::encode_into`], less immediate data: `v` ends at its
    /// offset, for a caller that puts the data after it itself.
    ///
    /// # Errors
    /// As [`Cmd::emit`]; `v` is then empty.
    pub fn encode_head_into(&self, v: &mut Vec<u8>) -> Result<()> {
        v.clear();
        let total = self.checked_len()?;
        let head = match self.data_out {
            DataDesc::Immediate { offset, .. } => usize::from(offset),
            _ => total,
        };
        v.reserve(total);
        v.resize(head, 0);
        if let Err(e) = self.emit_head_zeroed(v) {
            v.clear();
            return Err(e);
        }
        Ok(())
    }

    /// [`Cmd::buffer_len`] of an IU that can be emitted.
    fn checked_len(&self) -> Result<usize> {
        let cdb_area = self.cdb_area_len()?;
        if let DataDesc::Immediate { .. } = self.data_in {
            return Err(Error::DescFormat {
                dir: "data-in",
                format: DescFormat::Immediate.into(),
            });
        }
        for d in [&self.data_out, &self.data_in] {
            if let DataDesc::Indirect(i) = d {
                if i.descs.len() > usize::from(u8::MAX) {
                    return Err(Error::TooManyDescriptors(i.descs.len()));
                }
            }
        }
        let desc_end = self.desc_end_after(cdb_area);
        if let DataDesc::Immediate { offset, data } = self.data_out {
            let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
            if usize::from(offset) < desc_end || data.len() > u32::MAX as usize {
                return Err(Error::ImmediateBounds {
                    offset,
                    len,
                    desc_end,
                    iu_len: self.buffer_len(),
                });
            }
            // `buffer_len`: the offset is past the descriptors.
            return Ok(usize::from(offset) + data.len());
        }
        Ok(desc_end)
    }

    /// Writes everything but the immediate data into `buf` (reserved
    /// bytes zero): the whole IU, or with immediate data the bytes before
    /// it, which `buf` may end at. Returns where the data goes.
    fn emit_head(&self, buf: &mut [u8]) -> Result<usize> {
        let head = match self.data_out {
            DataDesc::Immediate { offset, .. } => usize::from(offset),
            _ => buf.len(),
        };
        buf[..head].fill(0);
        self.emit_head_zeroed(buf)
    }

    /// [`Cmd::emit_head`] into bytes that are zero already (a vector just
    /// resized): only the fields are written.
    fn emit_head_zeroed(&self, buf: &mut [u8]) -> Result<usize> {
        let cdb_area = self.cdb_area_len()?;
        let head = match self.data_out {
            DataDesc::Immediate { offset, .. } => usize::from(offset),
            _ => buf.len(),
        };
        let buf = &mut buf[..head];
        let mut p = CmdPacket::new_unchecked(&mut *buf);
        p.set_opcode(IuType::Cmd.into());
        p.set_sol_not(self.sol_not);
        p.set_buf_fmt((u8::from(self.data_out.format()) << 4) | u8::from(self.data_in.format()));
        p.set_data_out_desc_cnt(self.data_out.count());
        p.set_data_in_desc_cnt(self.data_in.count());
        p.set_tag(self.tag);
        p.set_lun(self.lun);
        p.set_task_attr(self.task_attr.into());
        // cdb_area - 16 <= 252, a multiple of 4: the byte holds words << 2.
        p.set_add_cdb_len(u8::try_from(cdb_area - 16).unwrap_or(0));
        buf[field::CDB.start..field::CDB.start + self.cdb.len()].copy_from_slice(self.cdb);
        let mut at = field::CDB.start + cdb_area;
        for d in [&self.data_out, &self.data_in] {
            match d {
                DataDesc::None => {}
                DataDesc::Direct(b) => {
                    at += b.emit(&mut buf[at..])?;
                }
                DataDesc::Indirect(i) => {
                    at += i.table.emit(&mut buf[at..])?;
                    buf[at..at + 4].copy_from_slice(&i.total_len.to_be_bytes());
                    at += 4;
                    let list = i.descs.as_bytes();
                    buf[at..at + list.len()].copy_from_slice(list);
                    at += list.len();
                }
                DataDesc::Immediate { data, .. } => {
                    let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
                    buf[at..at + IMM_BUF_LEN].copy_from_slice(&len.to_be_bytes());
                    at += IMM_BUF_LEN;
                }
            }
        }
        Ok(head)
    }
}

enum Parsed<'a> {
    Desc(DataDesc<'a>),
    Imm(u32),
}

fn parse_desc<'a>(
    buf: &'a [u8],
    at: &mut usize,
    dir: &'static str,
    format: DescFormat,
    count: u8,
) -> Result<Parsed<'a>> {
    let rest = buf.get(*at..).unwrap_or(&[]);
    match format {
        DescFormat::None => Ok(Parsed::Desc(DataDesc::None)),
        DescFormat::Direct => {
            let d = DirectBuf::parse(rest)?;
            *at += DIRECT_BUF_LEN;
            Ok(Parsed::Desc(DataDesc::Direct(d)))
        }
        DescFormat::Indirect => {
            let list_len = usize::from(count) * DIRECT_BUF_LEN;
            check_len(
                "SRP_CMD indirect descriptor",
                rest,
                INDIRECT_BUF_HEADER_LEN + list_len,
            )?;
            let table = DirectBuf::parse(rest)?;
            if table.len as usize % DIRECT_BUF_LEN != 0 {
                return Err(Error::TableLen(table.len));
            }
            if list_len > table.len as usize {
                return Err(Error::TableCount {
                    count,
                    table_len: table.len,
                });
            }
            let total_len = super::get_u32(rest, 16..20);
            let descs = DescList::new(&rest[INDIRECT_BUF_HEADER_LEN..][..list_len])?;
            *at += INDIRECT_BUF_HEADER_LEN + list_len;
            Ok(Parsed::Desc(DataDesc::Indirect(IndirectBuf {
                table,
                total_len,
                descs,
            })))
        }
        DescFormat::Immediate => {
            check_len("SRP_CMD immediate data descriptor", rest, IMM_BUF_LEN)?;
            *at += IMM_BUF_LEN;
            Ok(Parsed::Imm(super::get_u32(rest, 0..4)))
        }
        DescFormat::Unknown(f) => Err(Error::DescFormat { dir, format: f }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SRP_CMD of frame 6 of `linux-ib_srp-to-lio-srpt-over-rxe.pcapng`:
    /// Linux ib_srp's INQUIRY with one direct data-in descriptor.
    const CAPTURED_INQUIRY: [u8; 64] = [
        0x02, // opcode SRP_CMD
        0x00, // sol_not
        0, 0, 0,    // reserved
        0x01, // buf_fmt: data-out none, data-in direct
        0x00, // data_out_desc_cnt
        0x00, // data_in_desc_cnt (Linux leaves 0 for direct)
        0x28, 0, 0, 0, 0, 0, 0, 0, // tag 0x28 (little-endian u64)
        0, 0, 0, 0, // reserved
        0, 0, 0, 0, 0, 0, 0, 0,    // LUN 0
        0,    // reserved
        0x00, // task attribute SIMPLE
        0,    // reserved
        0x00, // additional CDB length 0
        0x12, 0x00, 0x00, 0x00, 0x24, 0x00, // CDB: INQUIRY, allocation length 36
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // CDB padding to 16
        0xff, 0xff, 0x8a, 0xde, 0x2d, 0xbe, 0x12, 0x00, // descriptor va
        0x00, 0x00, 0x04, 0x1d, // descriptor key
        0x00, 0x00, 0x00, 0x24, // descriptor length 36
    ];

    #[test]
    fn captured_inquiry_round_trips() {
        let c = Cmd::parse(&CAPTURED_INQUIRY, Some(68)).unwrap();
        assert_eq!(c.tag, Tag(0x28));
        assert_eq!(c.task_attr, TaskAttr::Simple);
        assert_eq!(&c.cdb[..6], &[0x12, 0, 0, 0, 0x24, 0]);
        assert_eq!(c.data_out, DataDesc::None);
        assert_eq!(
            c.data_in,
            DataDesc::Direct(DirectBuf {
                va: 0xffff_8ade_2dbe_1200,
                key: Rkey(0x41d),
                len: 36
            })
        );
        assert_eq!(c.buffer_len(), 64);
        let mut out = [0xaa; 64];
        assert_eq!(c.emit(&mut out), Ok(64));
        assert_eq!(out, CAPTURED_INQUIRY);
    }

    /// A WRITE(10) of 512 bytes as ib_srp sends it with immediate data.
    #[test]
    fn immediate_data_at_linux_offset() {
        let data = [0x5a; 512];
        let cdb = [0x2a, 0, 0, 0, 0, 8, 0, 0, 1, 0];
        let c = Cmd {
            sol_not: 0,
            tag: Tag(3),
            lun: Lun([0, 1, 0, 0, 0, 0, 0, 0]),
            task_attr: TaskAttr::Simple,
            cdb: &cdb,
            data_out: DataDesc::Immediate {
                offset: LINUX_IMM_DATA_OFFSET,
                data: &data,
            },
            data_in: DataDesc::None,
        };
        let v = {
            let mut v = vec![0xaa; c.buffer_len()];
            c.emit(&mut v).unwrap();
            v
        };
        assert_eq!(v.len(), 68 + 512);
        assert_eq!(v[5], 0x30, "data-out format 3 in the high nibble");
        assert_eq!(&v[6..8], &[0, 0], "no descriptor counts");
        assert_eq!(v[31], 0, "no additional CDB");
        assert_eq!(&v[48..52], &[0, 0, 2, 0], "srp_imm_buf.len = 512");
        assert!(v[52..68].iter().all(|&b| b == 0), "padding to the offset");
        assert_eq!(&v[68..], &data[..]);
        let back = Cmd::parse(&v, Some(68)).unwrap();
        assert_eq!(back.data_out, c.data_out);
        assert_eq!(&back.cdb[..10], &cdb);
        // Not negotiated, or the data would run past the IU: errors.
        assert_eq!(Cmd::parse(&v, None), Err(Error::ImmediateNotNegotiated));
        assert!(matches!(
            Cmd::parse(&v[..579], Some(68)),
            Err(Error::ImmediateBounds { .. })
        ));
        // The offset may not point into the descriptor.
        assert!(matches!(
            Cmd::parse(&v, Some(50)),
            Err(Error::ImmediateBounds { desc_end: 52, .. })
        ));
        let mut huge = v.clone();
        huge[48..52].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            Cmd::parse(&huge, Some(68)),
            Err(Error::ImmediateBounds { .. })
        ));
    }

    #[test]
    fn additional_cdb_and_indirect_table_in_iu() {
        // A 32-byte CDB (16 additional bytes: 4 words) and a bidirectional
        // command: indirect data-out with two descriptors, direct data-in.
        let cdb: Vec<u8> = (0..32).collect();
        let d1 = DirectBuf {
            va: 0x1000,
            key: Rkey(0x11),
            len: 0x200,
        };
        let d2 = DirectBuf {
            va: 0x3000,
            key: Rkey(0x22),
            len: 0x600,
        };
        let mut list = Vec::new();
        DescList::encode(&[d1, d2], &mut list);
        let out = IndirectBuf {
            table: DirectBuf {
                va: 0xabc0,
                key: Rkey(0x33),
                len: 32,
            },
            total_len: 0x800,
            descs: DescList::new(&list).unwrap(),
        };
        let din = DirectBuf {
            va: 0x9000,
            key: Rkey(0x44),
            len: 0x100,
        };
        let c = Cmd {
            sol_not: 0,
            tag: Tag(0x1_0000_0001),
            lun: Lun([0; 8]),
            task_attr: TaskAttr::Ordered,
            cdb: &cdb,
            data_out: DataDesc::Indirect(out),
            data_in: DataDesc::Direct(din),
        };
        assert_eq!(c.buffer_len(), 48 + 16 + 20 + 32 + 16);
        let mut v = vec![0u8; c.buffer_len()];
        c.emit(&mut v).unwrap();
        #[rustfmt::skip]
        let expected_head: [u8; 32] = [
            0x02, 0x00, 0, 0, 0, // opcode, sol_not, reserved
            0x21, // buf_fmt: data-out indirect, data-in direct
            0x02, // data_out_desc_cnt: 2 in the IU
            0x00, // data_in_desc_cnt
            0x01, 0, 0, 0, 0x01, 0, 0, 0, // tag
            0, 0, 0, 0, // reserved
            0, 0, 0, 0, 0, 0, 0, 0, // LUN
            0, 0x02, 0, // reserved, ORDERED, reserved
            0x10, // additional CDB: 4 words = 16 bytes
        ];
        assert_eq!(&v[..32], &expected_head);
        assert_eq!(&v[32..64], &cdb[..]);
        #[rustfmt::skip]
        let expected_idb: [u8; 20] = [
            0, 0, 0, 0, 0, 0, 0xab, 0xc0, // table va
            0, 0, 0, 0x33, // table key
            0, 0, 0, 0x20, // table length 32 (two descriptors)
            0, 0, 0x08, 0x00, // total length 0x800
        ];
        assert_eq!(&v[64..84], &expected_idb);
        assert_eq!(&v[84..116], &list[..]);
        assert_eq!(&v[116..124], &0x9000u64.to_be_bytes());
        let back = Cmd::parse(&v, None).unwrap();
        assert_eq!(back, c);
        match back.data_out {
            DataDesc::Indirect(i) => {
                assert!(!i.is_external());
                assert_eq!(i.descs.iter().collect::<Vec<_>>(), vec![d1, d2]);
            }
            _ => panic!("expected indirect"),
        }
    }

    #[test]
    fn external_table_and_inconsistent_counts() {
        // Table of 4 descriptors, only 1 in the IU: external.
        #[rustfmt::skip]
        let mut v: Vec<u8> = vec![
            0x02, 0, 0, 0, 0, 0x02, 0x00, 0x01, // data-in indirect, 1 descriptor in IU
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // tag, reserved
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // LUN, reserved, attr, reserved, add cdb
            0x28, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // CDB READ(10)
            0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 7, 0, 0, 0, 0x40, // table: 64 bytes
            0, 0, 0x40, 0, // total length 16 KiB
            0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 7, 0, 0, 0x10, 0, // first descriptor
        ];
        let c = Cmd::parse(&v, None).unwrap();
        match c.data_in {
            DataDesc::Indirect(i) => {
                assert!(i.is_external());
                assert_eq!(i.table_entries(), 4);
                assert_eq!(i.descs.len(), 1);
                assert_eq!(i.total_len, 0x4000);
            }
            _ => panic!("expected indirect"),
        }
        let mut out = vec![0; c.buffer_len()];
        c.emit(&mut out).unwrap();
        assert_eq!(out, v);
        // More descriptors claimed than the IU holds.
        v[7] = 2;
        assert!(matches!(Cmd::parse(&v, None), Err(Error::Truncated { .. })));
        // More descriptors in the IU than the table length covers.
        v.extend_from_slice(&[0; 16]);
        v[63] = 0x10;
        assert!(matches!(
            Cmd::parse(&v, None),
            Err(Error::TableCount { .. })
        ));
        // A table length that is not whole descriptors.
        v[63] = 0x41;
        assert_eq!(Cmd::parse(&v, None), Err(Error::TableLen(0x41)));
        // Unknown format nibble.
        v[5] = 0x05;
        assert!(matches!(
            Cmd::parse(&v, None),
            Err(Error::DescFormat {
                dir: "data-in",
                format: 5
            })
        ));
        // Immediate data-in is not a thing.
        v[5] = 0x03;
        assert!(matches!(
            Cmd::parse(&v, Some(68)),
            Err(Error::DescFormat {
                dir: "data-in",
                format: 3
            })
        ));
    }

    #[test]
    fn add_cdb_len_past_iu_and_oversized_cdb() {
        let mut v = CAPTURED_INQUIRY;
        v[31] = 0xfc; // 252 additional bytes that are not there
        assert!(matches!(Cmd::parse(&v, None), Err(Error::Truncated { .. })));
        let big = [0u8; 16 + 253];
        let c = Cmd {
            sol_not: 0,
            tag: Tag(0),
            lun: Lun::default(),
            task_attr: TaskAttr::Simple,
            cdb: &big,
            data_out: DataDesc::None,
            data_in: DataDesc::None,
        };
        assert_eq!(c.emit(&mut [0u8; 600]), Err(Error::CdbLen(269)));
        // 256 descriptors do not fit the one-byte count.
        let table = vec![0u8; 256 * DIRECT_BUF_LEN];
        let c = Cmd {
            cdb: &[0x28],
            data_in: DataDesc::Indirect(IndirectBuf {
                table: DirectBuf::default(),
                total_len: 0,
                descs: DescList::new(&table).unwrap(),
            }),
            ..c
        };
        assert_eq!(
            c.emit(&mut vec![0u8; c.buffer_len()]),
            Err(Error::TooManyDescriptors(256))
        );
    }
}
