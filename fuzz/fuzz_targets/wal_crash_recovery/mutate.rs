//! Crash mutations applied to a copy of a base state's files, and the
//! classification of what they left (an intact database file, intact WAL
//! frames).

use super::*;

pub(crate) struct Input<'a>(pub(crate) &'a [u8]);

impl Input<'_> {
    pub(crate) fn byte(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte().unwrap_or(0), self.byte().unwrap_or(0)])
    }
    fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | (u32::from(self.u16()) << 16)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let n = n.min(self.0.len());
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        b.to_vec()
    }
}

/// Fills `len` bytes at `off` (growing the file if needed): zeros, ones,
/// one repeated byte, or bytes from the input.
pub(crate) fn fill(
    file: &mut Option<Vec<u8>>,
    off: usize,
    len: usize,
    pattern: u8,
    input: &mut Input,
) {
    let f = file.get_or_insert_with(Vec::new);
    let src = if pattern % 4 == 3 {
        input.bytes(len)
    } else {
        Vec::new()
    };
    let b = match pattern % 4 {
        0 => 0,
        1 => 0xff,
        _ => pattern,
    };
    if f.len() < off + len {
        f.resize(off + len, 0);
    }
    for (i, x) in f[off..off + len].iter_mut().enumerate() {
        *x = if pattern % 4 == 3 {
            src.get(i).copied().unwrap_or(0xa5)
        } else {
            b
        };
    }
}

pub(crate) fn truncate(file: &mut Option<Vec<u8>>, len: usize) {
    if let Some(f) = file {
        f.truncate(len);
    }
}

/// A well-formed watermark file whose newest slot says `m`, built through
/// the real writer.
pub(crate) fn forge(scratch: &Path, current: Option<&[u8]>, m: &Watermark) -> Vec<u8> {
    let p = scratch.join("forge");
    let _ = std::fs::remove_file(&p);
    if let Some(b) = current {
        std::fs::write(&p, b).expect("forge");
    }
    match WatermarkFile::open(&p, *m) {
        Ok((mut f, _)) => f.store(m).expect("store"),
        Err(_) => {
            std::fs::remove_file(&p).expect("rm forge");
            WatermarkFile::open(&p, *m).expect("fresh forge");
        }
    }
    std::fs::read(&p).expect("forged")
}

pub(crate) fn mutate(base: &Base, sc: &Scenario, input: &mut Input) -> Files {
    let mut files = sc.files.clone();
    let fb = frame_bytes(PAGE_SIZE) as usize;
    for _ in 0..MAX_OPS {
        let Some(op) = input.byte() else { break };
        let which = match usize::from(input.byte().unwrap_or(0) % 4) {
            // A primary has no watermark file: its WAL instead.
            MARK if matches!(sc.role, Role::Primary) => WAL,
            w => w,
        };
        let len_of = |files: &Files, i: usize| files[i].as_ref().map_or(0, Vec::len);
        match op % 12 {
            // Truncate a file at an arbitrary offset.
            0 => {
                let len = len_of(&files, which);
                truncate(&mut files[which], input.u32() as usize % (len + 1));
            }
            // Truncate the WAL at or inside a frame, or the database at a page.
            1 => {
                if which % 2 == 0 {
                    let n = usize::from(input.u16()) % (len_of(&files, DB) / PS + 2);
                    truncate(&mut files[DB], n * PS);
                } else {
                    let n = usize::from(input.byte().unwrap_or(0));
                    let inside = usize::from(input.u16()) % fb;
                    truncate(&mut files[WAL], WAL_HEADER_BYTES + n * fb + inside);
                }
            }
            // Overwrite a range (possibly past the end) with a pattern.
            2 | 3 => {
                let len = len_of(&files, which);
                let off = input.u32() as usize % (len + 64);
                let n = if op % 12 == 2 {
                    usize::from(input.u16()) % 2048 + 1
                } else {
                    usize::from(input.byte().unwrap_or(0)) % 64 + 1
                };
                let pattern = input.byte().unwrap_or(0);
                fill(&mut files[which], off, n, pattern, input);
            }
            // Tear a WAL frame: part of its header or page.
            4 => {
                let frame = usize::from(input.byte().unwrap_or(0)) % (sc.scan.frames.len() + 2);
                let inside = usize::from(input.u16()) % fb;
                let n = usize::from(input.u16()) % (fb - inside) + 1;
                let pattern = input.byte().unwrap_or(0);
                fill(
                    &mut files[WAL],
                    WAL_HEADER_BYTES + frame * fb + inside,
                    n,
                    pattern,
                    input,
                );
            }
            // Tear a database page.
            5 => {
                let page = usize::from(input.byte().unwrap_or(0)) % (len_of(&files, DB) / PS + 2);
                let inside = usize::from(input.u16()) % PS;
                let n = usize::from(input.u16()) % (PS - inside) + 1;
                let pattern = input.byte().unwrap_or(0);
                fill(&mut files[DB], page * PS + inside, n, pattern, input);
            }
            // Grow a file with a pattern.
            6 => {
                let len = len_of(&files, which);
                let n = usize::from(input.u16()) % 4096 + 1;
                let pattern = input.byte().unwrap_or(0);
                fill(&mut files[which], len, n, pattern, input);
            }
            // Delete a file.
            7 => files[which] = None,
            // Replace the wal-index with a pattern of some size.
            8 => {
                let n = usize::from(input.u16()) % (64 * 1024);
                let pattern = input.byte().unwrap_or(0);
                files[SHM] = Some(Vec::new());
                fill(&mut files[SHM], 0, n, pattern, input);
            }
            // Tear one watermark slot.
            9 => {
                let slot = (which % 2) * 64;
                let inside = usize::from(input.byte().unwrap_or(0)) % 64;
                let n = usize::from(input.byte().unwrap_or(0)) % (64 - inside) + 1;
                let pattern = input.byte().unwrap_or(0);
                fill(&mut files[MARK], slot + inside, n, pattern, input);
            }
            // A stale watermark file: an earlier persisted image.
            10 => {
                if let Role::Replica { snapshots, .. } = &sc.role {
                    let i = usize::from(input.byte().unwrap_or(0)) % snapshots.len();
                    files[MARK] = Some(snapshots[i].clone());
                }
            }
            // A forged, well-formed watermark: a persisted one with fields
            // changed, or pointing at a frame of the WAL.
            _ => {
                let Role::Replica { history, .. } = &sc.role else {
                    continue;
                };
                let mut m = history[usize::from(input.byte().unwrap_or(0)) % history.len()].0;
                let what = input.byte().unwrap_or(0);
                let delta = input.byte().unwrap_or(0) as i8 as i32;
                if what & 1 != 0 {
                    m.frame = m.frame.wrapping_add_signed(delta);
                }
                if what & 2 != 0 {
                    m.bookmark = Bookmark::new(
                        Epoch(m.bookmark.epoch.0.max(1)),
                        Sequence(m.bookmark.sequence.0.wrapping_add_signed(i64::from(delta))),
                    );
                }
                if what & 4 != 0 {
                    m.salt[usize::from(input.byte().unwrap_or(0)) % 8] ^= input.byte().unwrap_or(1);
                }
                if what & 8 != 0 {
                    // Point at a frame of the WAL, with its real checksum.
                    let n = usize::from(input.byte().unwrap_or(0)) % (sc.scan.frames.len() + 1);
                    if n > 0 {
                        let wal = sc.files[WAL].as_deref().unwrap_or_default();
                        let off = frame_offset(PAGE_SIZE, FrameNo::new(n as u32)) as usize;
                        let mut hb = [0u8; FRAME_HEADER_BYTES];
                        hb.copy_from_slice(&wal[off..off + FRAME_HEADER_BYTES]);
                        let fh = FrameHeader::decode(&hb);
                        m.frame = n as u32;
                        m.checksum = fh.checksum;
                        if let Some(s) = sc.scan.salt {
                            m.salt = s;
                        }
                    }
                }
                if what & 16 != 0 {
                    m.db_pages = m.db_pages.wrapping_add_signed(delta);
                }
                if what & 32 != 0 {
                    m.page_size = [0, 1, 3, 511, 1024, 4096, 65536, u32::MAX]
                        [usize::from(input.byte().unwrap_or(0)) % 8];
                }
                if what & 64 != 0 {
                    m.checksum.0 ^= u32::from(input.byte().unwrap_or(1));
                }
                files[MARK] = Some(forge(&base.scratch, files[MARK].as_deref(), &m));
            }
        }
    }
    files
}

// ------------------------------------------------------------ classification

/// Whether the database file differs from the base state only where a
/// crash during a checkpoint could have left it: torn or missing pages
/// that WAL frames in `cover` hold, or pages past both the base file and
/// the database's size `db_pages`. Base pages never go missing: a
/// checkpoint never shrinks the file below a state the WAL still names.
pub(crate) fn db_plausible(
    base: &[u8],
    new: Option<&[u8]>,
    cover: &BTreeSet<u32>,
    db_pages: u32,
) -> bool {
    let Some(new) = new else { return false };
    let base_pages = base.len() / PS;
    let new_pages = new.len().div_ceil(PS);
    (1..=base_pages.max(new_pages)).all(|p| {
        let range = (p - 1) * PS..p * PS;
        if p <= base_pages {
            match new.get(range.clone()) {
                None => false,
                Some(n) => n == &base[range] || cover.contains(&(p as u32)),
            }
        } else {
            cover.contains(&(p as u32)) || p as u32 > db_pages
        }
    })
}

pub(crate) fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Complete WAL frames of the base state that survived unchanged.
pub(crate) fn intact_frames(sc: &Scenario, files: &Files) -> usize {
    let (Some(base), Some(new)) = (sc.files[WAL].as_deref(), files[WAL].as_deref()) else {
        return 0;
    };
    let intact = common_prefix(base, new);
    if intact < WAL_HEADER_BYTES {
        return 0;
    }
    ((intact - WAL_HEADER_BYTES) / frame_bytes(PAGE_SIZE) as usize).min(sc.scan.frames.len())
}

/// Which files an input changed, for the trace.
pub(crate) fn changes(sc: &Scenario, files: &Files) -> String {
    let names = ["db", "wal", "shm", "mark"];
    let mut out = Vec::new();
    for (i, name) in names.iter().enumerate() {
        match (&sc.files[i], &files[i]) {
            (a, b) if a == b => {}
            (_, None) => out.push(format!("{name} deleted")),
            (None, Some(b)) => out.push(format!("{name} created ({} bytes)", b.len())),
            (Some(a), Some(b)) => {
                let at = common_prefix(a, b);
                out.push(format!("{name} {}->{} bytes from {at}", a.len(), b.len()));
            }
        }
    }
    if out.is_empty() {
        "unchanged".into()
    } else {
        out.join(", ")
    }
}
