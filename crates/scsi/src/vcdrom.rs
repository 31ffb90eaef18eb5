//! The virtual CD-ROM handler (SCST's `vcdrom`): a read-only MMC device
//! (peripheral type 05h, removable) whose medium is an ISO image file,
//! with 2048-byte blocks (MMC-6 4.2.2: a data CD's user data per sector).
//!
//! What it answers (MMC-6, SPC-4): INQUIRY (type 5, RMB; VPD pages as the
//! emulated disks give them), TEST UNIT READY, READ CAPACITY(10) and
//! (16), READ(10), READ(12) and READ(16), READ TOC/PMA/ATIP formats 0 (the one data track and the
//! lead-out, LBA or MSF) and 1 (session information), GET CONFIGURATION
//! (profile CD-ROM, features Profile List, Core, Removable Medium, Random
//! Readable, CD Read), GET EVENT STATUS NOTIFICATION (media class, polled),
//! MODE SENSE(6/10) of the capabilities page 2Ah, PREVENT ALLOW MEDIUM
//! REMOVAL, START STOP UNIT (eject, refused while removal is prevented).
//! Writes are DATA PROTECT / WRITE PROTECTED; other opcodes INVALID
//! COMMAND OPERATION CODE. Without a medium (no image, an empty one, or
//! ejected) every medium access is NOT READY / MEDIUM NOT PRESENT.
//!
//! The image can be changed while the unit is exported ([`VCdrom::load`],
//! [`VCdrom::eject`]); the target then gives every nexus NOT READY TO
//! READY CHANGE, MEDIUM MAY HAVE CHANGED (28/00), as a drive whose tray
//! was closed on another disc does. What stays the target's, as for the
//! pass-through handler: REPORT LUNS, REQUEST SENSE, unit attentions,
//! persistent reservations, ALUA.
//!
//! Reads are synchronous on the caller's thread (`pread` of the image):
//! the unit's `never_blocks` is false, so a transport runs them on a
//! worker.

use crate::sense::{Asc, Sense, SenseKey};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering::SeqCst};
use std::sync::RwLock;

/// The block size of a data CD (MMC-6 4.2.2, mode 1 user data).
pub const CD_BLOCK: u64 = 2048;

/// Most blocks one READ moves (8 MiB), as the emulated disks bound theirs.
pub const MAX_READ_BLOCKS: u32 = 4096;

/// An image in the drive.
struct Medium {
    file: std::fs::File,
    path: PathBuf,
    blocks: u64,
}

/// Why an image cannot be the medium.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("cannot open {path} for reading: {source}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a regular file: name an ISO image")]
    NotFile { path: String },
    #[error(
        "{path} is {size} bytes, not a whole number of 2048-byte CD blocks: \
         is it an ISO image? (pad it, or make it again with xorriso/genisoimage)"
    )]
    Size { path: String, size: u64 },
    #[error("the device is not a virtual CD-ROM (handler vcdrom): it has no medium to change")]
    NotCdrom,
}

/// Media event notification (MMC-6 6.8.2.4): what GET EVENT STATUS
/// NOTIFICATION reports once.
const EVENT_NONE: u8 = 0;
const EVENT_NEW_MEDIA: u8 = 2;
const EVENT_MEDIA_REMOVAL: u8 = 3;

/// The virtual CD-ROM of one logical unit.
pub struct VCdrom {
    medium: RwLock<Option<Medium>>,
    /// PREVENT ALLOW MEDIUM REMOVAL's PREVENT bit, from any initiator.
    prevent: AtomicBool,
    /// The media event not yet reported.
    event: AtomicU8,
}

impl VCdrom {
    /// A drive with the image at `path` in it, or empty (`None`, or an
    /// empty file: SCST's way of configuring a drive with no disc).
    ///
    /// # Errors
    /// [`ImageError`]: the image cannot be read or is not whole blocks.
    pub fn new(path: Option<&Path>) -> Result<VCdrom, ImageError> {
        let medium = path.map(open_image).transpose()?.flatten();
        Ok(VCdrom {
            medium: RwLock::new(medium),
            prevent: AtomicBool::new(false),
            event: AtomicU8::new(EVENT_NONE),
        })
    }

    /// The image in the drive, if any.
    pub fn image(&self) -> Option<PathBuf> {
        self.read_medium().as_ref().map(|m| m.path.clone())
    }

    /// Blocks of the medium (0: none).
    pub fn blocks(&self) -> u64 {
        self.read_medium().as_ref().map_or(0, |m| m.blocks)
    }

    /// Puts the image at `path` in the drive (an empty file: none), in
    /// place of what was there, even while removal is prevented (the
    /// administrator's hand). The caller raises 28/00 on every nexus
    /// ([`crate::Target::change_medium`] does).
    ///
    /// # Errors
    /// [`ImageError`]; the drive then keeps what it had.
    pub fn load(&self, path: &Path) -> Result<(), ImageError> {
        let m = open_image(path)?;
        let event = if m.is_some() {
            EVENT_NEW_MEDIA
        } else {
            EVENT_MEDIA_REMOVAL
        };
        *self.medium.write().unwrap_or_else(|e| e.into_inner()) = m;
        self.event.store(event, SeqCst);
        Ok(())
    }

    /// Takes the medium out; false when there was none.
    pub fn eject(&self) -> bool {
        let had = self
            .medium
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .is_some();
        if had {
            self.event.store(EVENT_MEDIA_REMOVAL, SeqCst);
        }
        had
    }

    fn read_medium(&self) -> std::sync::RwLockReadGuard<'_, Option<Medium>> {
        self.medium.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs one command (not one the target keeps): data-in, or the sense
    /// of a CHECK CONDITION. `dev` gives the identity; `alloc` is the
    /// transport's expected data-in length, at which data other than a
    /// READ's is cut (a READ's is all the CDB asks for: see [`is_read`]).
    pub(crate) fn execute(
        &self,
        dev: &crate::Device,
        cdb: &[u8],
        alloc: usize,
    ) -> Result<Vec<u8>, Sense> {
        let op = *cdb.first().ok_or_else(invalid_opcode)?;
        let need = |n: usize| {
            if cdb.len() < n {
                Err(invalid_opcode())
            } else {
                Ok(())
            }
        };
        let mut d = match op {
            0x00 => {
                self.with_medium(|_| Ok(()))?;
                Vec::new()
            }
            0x12 => {
                need(6)?;
                self.inquiry(dev, cdb)?
            }
            0x25 => {
                need(10)?;
                self.with_medium(|m| {
                    let last = (m.blocks - 1).min(0xffff_ffff) as u32;
                    let mut d = last.to_be_bytes().to_vec();
                    d.extend_from_slice(&(CD_BLOCK as u32).to_be_bytes());
                    Ok(d)
                })?
            }
            0x28 => {
                need(10)?;
                let lba = u32::from_be_bytes([cdb[2], cdb[3], cdb[4], cdb[5]]);
                let n = u16::from_be_bytes([cdb[7], cdb[8]]) as u32;
                self.read(lba, n, 7)?
            }
            // READ(16) and READ CAPACITY(16), which initiators written
            // for disks send (SCST's vcdrom takes them too).
            0x88 => {
                need(16)?;
                let lba = u64::from_be_bytes(cdb[2..10].try_into().expect("8 bytes"));
                let n = u32::from_be_bytes([cdb[10], cdb[11], cdb[12], cdb[13]]);
                let lba = u32::try_from(lba).map_err(|_| {
                    let mut s = Sense::new(SenseKey::IllegalRequest, Asc::LBA_OUT_OF_RANGE);
                    s.information = Some(lba);
                    s
                })?;
                self.read(lba, n, 10)?
            }
            0x9e if cdb.get(1).is_some_and(|b| b & 0x1f == 0x10) => {
                need(16)?;
                self.with_medium(|m| {
                    let mut d = vec![0u8; 32];
                    d[..8].copy_from_slice(&(m.blocks - 1).to_be_bytes());
                    d[8..12].copy_from_slice(&(CD_BLOCK as u32).to_be_bytes());
                    Ok(d)
                })?
            }
            0xa8 => {
                need(12)?;
                let lba = u32::from_be_bytes([cdb[2], cdb[3], cdb[4], cdb[5]]);
                let n = u32::from_be_bytes([cdb[6], cdb[7], cdb[8], cdb[9]]);
                self.read(lba, n, 6)?
            }
            0x43 => {
                need(10)?;
                self.read_toc(cdb)?
            }
            0x46 => {
                need(10)?;
                self.configuration(cdb)?
            }
            0x4a => {
                need(10)?;
                self.event_status(cdb)?
            }
            0x1a | 0x5a => {
                need(if op == 0x1a { 6 } else { 10 })?;
                self.mode_sense(op == 0x5a, cdb)?
            }
            0x1e => {
                need(6)?;
                self.prevent.store(cdb[4] & 0x01 != 0, SeqCst);
                Vec::new()
            }
            0x1b => {
                need(6)?;
                // LOEJ with START clear: eject (MMC-6 6.39).
                if cdb[4] & 0x03 == 0x02 {
                    if self.prevent.load(SeqCst) {
                        return Err(Sense::new(
                            SenseKey::IllegalRequest,
                            Asc::MEDIUM_REMOVAL_PREVENTED,
                        ));
                    }
                    self.eject();
                }
                Vec::new()
            }
            0x35 => Vec::new(),
            // WRITE(6/10/12/16), WRITE AND VERIFY(10), WRITE SAME(10/16),
            // FORMAT UNIT, RESERVE TRACK, CLOSE TRACK/SESSION, SEND CUE
            // SHEET, BLANK, UNMAP, COMPARE AND WRITE.
            0x0a | 0x2a | 0xaa | 0x8a | 0x2e | 0x41 | 0x93 | 0x04 | 0x53 | 0x5b | 0x5d | 0xa1
            | 0x42 | 0x89 => {
                return Err(Sense::new(SenseKey::DataProtect, Asc::WRITE_PROTECTED));
            }
            _ => return Err(invalid_opcode()),
        };
        // A READ's data is what the CDB asks for (the caller tells an
        // overflow); other data is cut at the allocation length.
        if !is_read(cdb) {
            d.truncate(alloc);
        }
        Ok(d)
    }

    fn with_medium<T>(&self, f: impl FnOnce(&Medium) -> Result<T, Sense>) -> Result<T, Sense> {
        match self.read_medium().as_ref() {
            Some(m) => f(m),
            None => Err(Sense::new(SenseKey::NotReady, Asc::MEDIUM_NOT_PRESENT)),
        }
    }

    fn read(&self, lba: u32, n: u32, len_at: u16) -> Result<Vec<u8>, Sense> {
        self.with_medium(|m| {
            if u64::from(lba) + u64::from(n) > m.blocks {
                let mut s = Sense::new(SenseKey::IllegalRequest, Asc::LBA_OUT_OF_RANGE);
                s.information = Some(u64::from(lba));
                return Err(s);
            }
            if n > MAX_READ_BLOCKS {
                return Err(Sense::invalid_field(len_at, None));
            }
            let mut v = vec![0u8; (u64::from(n) * CD_BLOCK) as usize];
            m.file
                .read_exact_at(&mut v, u64::from(lba) * CD_BLOCK)
                .map_err(|_| Sense::new(SenseKey::MediumError, Asc::UNRECOVERED_READ_ERROR))?;
            Ok(v)
        })
    }

    fn inquiry(&self, dev: &crate::Device, cdb: &[u8]) -> Result<Vec<u8>, Sense> {
        let evpd = cdb[1] & 0x01 != 0;
        if !evpd && cdb[2] != 0 {
            return Err(Sense::invalid_field(2, None));
        }
        let mut d = dev.inquiry(evpd, cdb[2])?;
        // Peripheral device type 05h: CD/DVD (SPC-4 table 139).
        d[0] = 0x05;
        if !evpd {
            d[1] = 0x80; // RMB
            d[3] &= !0x20; // no NORMACA: the core refuses NACA=1 here
        } else if cdb[2] == 0x00 {
            // The block device pages (B0h..B2h) are SBC's, not MMC's.
            let pages: Vec<u8> = d[4..].iter().copied().filter(|p| *p < 0xb0).collect();
            d.truncate(4);
            d[2..4].copy_from_slice(&(pages.len() as u16).to_be_bytes());
            d.extend_from_slice(&pages);
        } else if cdb[2] >= 0xb0 {
            return Err(Sense::invalid_field(2, None));
        }
        Ok(d)
    }

    /// READ TOC/PMA/ATIP (MMC-6 6.26): format 0 (TOC) and 1 (session
    /// information) of a single-session disc with one data track.
    fn read_toc(&self, cdb: &[u8]) -> Result<Vec<u8>, Sense> {
        let msf = cdb[1] & 0x02 != 0;
        let format = cdb[2] & 0x0f;
        let track = cdb[6];
        self.with_medium(|m| {
            let addr = |lba: u64| -> [u8; 4] {
                if msf {
                    // MMC-6 6.26.3.2: MSF = LBA + 150 frames (2 s lead-in),
                    // 75 frames a second.
                    let f = lba + 150;
                    let minutes = (f / (60 * 75)).min(255) as u8;
                    [0, minutes, ((f / 75) % 60) as u8, (f % 75) as u8]
                } else {
                    (lba as u32).to_be_bytes()
                }
            };
            // ADR 1 (Q sub-channel position), CONTROL 4 (data track).
            let descriptor = |number: u8, lba: u64| {
                let mut t = vec![0, 0x14, number, 0];
                t.extend_from_slice(&addr(lba));
                t
            };
            let mut d = vec![0, 0, 1, 1];
            match format {
                0 => {
                    if track > 1 && track != 0xaa {
                        return Err(Sense::invalid_field(6, None));
                    }
                    if track <= 1 {
                        d.extend_from_slice(&descriptor(1, 0));
                    }
                    d.extend_from_slice(&descriptor(0xaa, m.blocks));
                }
                1 => d.extend_from_slice(&descriptor(1, 0)),
                _ => return Err(Sense::invalid_field(2, None)),
            }
            let n = (d.len() - 2) as u16;
            d[..2].copy_from_slice(&n.to_be_bytes());
            Ok(d)
        })
    }

    /// GET CONFIGURATION (MMC-6 6.6): the features of a CD-ROM drive; the
    /// current profile 0008h with a disc, 0000h without.
    fn configuration(&self, cdb: &[u8]) -> Result<Vec<u8>, Sense> {
        let rt = cdb[1] & 0x03;
        let start = u16::from_be_bytes([cdb[2], cdb[3]]);
        let present = self.read_medium().is_some();
        // (feature code, version, persistent, always current, data).
        let features: [(u16, u8, bool, bool, &[u8]); 5] = [
            // Profile List: CD-ROM (0008h), current with a disc.
            (0x0000, 0, true, true, &[0x00, 0x08, u8::from(present), 0]),
            // Core: physical interface 1 (SCSI family), DBE.
            (0x0001, 1, true, true, &[0, 0, 0, 1, 0x01, 0, 0, 0]),
            // Removable Medium: tray loading mechanism, eject, lock.
            (0x0003, 0, true, true, &[0x29, 0, 0, 0]),
            // Random Readable: 2048-byte blocks, blocking 1.
            (0x0010, 0, false, false, &[0, 0, 0x08, 0x00, 0, 1, 0, 0]),
            // CD Read.
            (0x001e, 1, false, false, &[0, 0, 0, 0]),
        ];
        let mut d = vec![0u8; 8];
        d[6..8].copy_from_slice(&(if present { 0x0008u16 } else { 0 }).to_be_bytes());
        for (code, version, persistent, always, data) in features {
            let current = always || present;
            let take = match rt {
                0 => code >= start,
                1 => code >= start && current,
                2 => code == start,
                _ => return Err(Sense::invalid_field(1, Some(0))),
            };
            if !take {
                continue;
            }
            d.extend_from_slice(&code.to_be_bytes());
            d.push(version << 2 | u8::from(persistent) << 1 | u8::from(current));
            d.push(data.len() as u8);
            d.extend_from_slice(data);
        }
        let n = (d.len() - 4) as u32;
        d[..4].copy_from_slice(&n.to_be_bytes());
        Ok(d)
    }

    /// GET EVENT STATUS NOTIFICATION (MMC-6 6.8), polled only: the media
    /// class, its event reported once.
    fn event_status(&self, cdb: &[u8]) -> Result<Vec<u8>, Sense> {
        if cdb[1] & 0x01 == 0 {
            // Asynchronous operation is not supported (MMC-6 6.8.2.1).
            return Err(Sense::invalid_field(1, Some(0)));
        }
        const MEDIA: u8 = 1 << 4;
        let mut d = vec![0, 0, 0, MEDIA];
        if cdb[4] & MEDIA == 0 {
            // No class asked that the drive has: NEA, header only.
            d[1] = 2;
            d[2] = 0x80;
            return Ok(d);
        }
        let event = self.event.swap(EVENT_NONE, SeqCst);
        let present = self.read_medium().is_some();
        d[1] = 6;
        d[2] = 4; // notification class: media
        d.extend_from_slice(&[event, if present { 0x02 } else { 0 }, 0, 0]);
        Ok(d)
    }

    /// MODE SENSE(6/10) of the CD capabilities and mechanical status page
    /// (MMC-3 6.3.11, page 2Ah; what Linux's sr reads), alone or as every
    /// page (3Fh); no block descriptors.
    fn mode_sense(&self, ten: bool, cdb: &[u8]) -> Result<Vec<u8>, Sense> {
        let pc = cdb[2] >> 6;
        let page = cdb[2] & 0x3f;
        if page != 0x2a && page != 0x3f {
            return Err(Sense::invalid_field(2, Some(5)));
        }
        if pc == 3 {
            return Err(Sense::new(
                SenseKey::IllegalRequest,
                Asc::SAVING_PARAMETERS_NOT_SUPPORTED,
            ));
        }
        let mut p = vec![0u8; 22];
        p[0] = 0x2a;
        p[1] = 20;
        if pc != 1 {
            p[2] = 0x01; // reads CD-R
            p[4] = 0x40; // multi-session
                         // Lock, lock state, eject; tray loading mechanism (001b).
            let locked = u8::from(self.prevent.load(SeqCst)) << 1;
            p[6] = 0x01 | locked | 0x08 | 0x20;
            p[12..14].copy_from_slice(&2u16.to_be_bytes()); // buffer size, KB
        }
        let mut d = if ten { vec![0u8; 8] } else { vec![0u8; 4] };
        d.extend_from_slice(&p);
        if ten {
            let n = (d.len() - 2) as u16;
            d[..2].copy_from_slice(&n.to_be_bytes());
        } else {
            d[0] = (d.len() - 1) as u8;
        }
        Ok(d)
    }
}

/// READ(10), READ(12), READ(16): data-in of the length the CDB gives.
pub(crate) fn is_read(cdb: &[u8]) -> bool {
    matches!(cdb.first(), Some(0x28 | 0xa8 | 0x88))
}

fn invalid_opcode() -> Sense {
    Sense::new(
        SenseKey::IllegalRequest,
        Asc::INVALID_COMMAND_OPERATION_CODE,
    )
}

/// Opens an image read-only: `None` for an empty file (no disc).
fn open_image(path: &Path) -> Result<Option<Medium>, ImageError> {
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| ImageError::Open {
        path: shown.clone(),
        source,
    })?;
    let meta = file.metadata().map_err(|source| ImageError::Open {
        path: shown.clone(),
        source,
    })?;
    if !meta.is_file() {
        return Err(ImageError::NotFile { path: shown });
    }
    let size = meta.len();
    if size % CD_BLOCK != 0 {
        return Err(ImageError::Size { path: shown, size });
    }
    Ok((size > 0).then(|| Medium {
        file,
        path: path.to_path_buf(),
        blocks: size / CD_BLOCK,
    }))
}
