//! The capture algorithm, free of FFI: WAL writes in, page sets out.
//!
//! SQLite appends a write transaction's frames to the WAL while it holds the
//! WAL write lock, and only then. Between taking and releasing that lock
//! ("a hold") it may write a new WAL header (a restart), write frame headers
//! and pages as separate calls, overwrite a page it already wrote in this
//! transaction, rewrite frame-header checksums (`walRewriteChecksums`), rewind
//! to a savepoint and overwrite what followed, or give up without a commit
//! frame (rollback).
//!
//! So capture does not follow calls, it follows file offsets: every byte
//! written to the WAL during a hold is copied into a shadow of the file range
//! `[base, end)`, where `base` is the start of the first frame the hold wrote.
//! When the lock is released the shadow holds exactly the final bytes of
//! every frame written during the hold. The committed transaction is frames
//! `base ..= c`, where `c` is the first commit frame at or after `base`:
//! SQLite writes frames strictly in sequence from `mxFrame + 1`, a rewind
//! only moves that point back within the hold, and only the last frame of a
//! commit carries a database size. Frames past `c` are leftovers of a
//! rolled-back savepoint or sector padding and belong to nothing.
//!
//! Invariants checked on every capture, in release builds too:
//! - every frame in `base ..= c` has the header's salts and continues the
//!   checksum chain from frame `base - 1` (or the header): the captured bytes
//!   are exactly what SQLite's own recovery would accept;
//! - the page set is well formed (see [`PageSet::new`]).
//!
//! A violated invariant poisons the capture: the database must not take
//! another write whose capture could be wrong, so every later WAL write is
//! refused until the database is reopened.

use crate::buffer_pool::BufferPool;
use crate::page_set::{CapturedTransaction, FrameNo, PageNo, PageSet, PageSetError, WalPosition};
use crate::wal_format::{
    Checksum, FRAME_HEADER_BYTES, FrameHeader, WAL_HEADER_BYTES, WalFormatError, WalHeader,
    frame_at, frame_offset,
};
use crate::wal_index::IndexHeader;
use crate::write_behind::{Route, WriteBehind};
use std::sync::Arc;

/// Why a transaction could not be captured. Once returned, the capture is
/// poisoned and every later WAL write fails.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaptureError {
    #[error(
        "WAL written while walrelay did not see the WAL write lock held (capture would be bypassed)"
    )]
    WriteOutsideHold,
    #[error("unexpected WAL header write at offset {offset}, {len} bytes")]
    UnexpectedHeaderWrite { offset: u64, len: usize },
    #[error("WAL frames written before any WAL header exists")]
    MissingHeader,
    #[error("captured WAL is not valid: {0}")]
    Format(#[from] WalFormatError),
    #[error("captured page set is not valid: {0}")]
    PageSet(#[from] PageSetError),
    #[error("reading back the WAL failed: {0}")]
    Io(String),
    #[error("the capture sink refused transaction: {0}")]
    Sink(String),
    #[error("a panic occurred inside the capture path: {0}")]
    Panic(String),
    #[error("a published commit's frames were not all written to the WAL file")]
    UnwrittenCommit,
}

/// Positioned reads of the WAL file, for the rare cases the shadow lacks
/// bytes (a hold that starts mid-file after a restart of this process).
pub(crate) trait WalReader {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
}

#[derive(Debug, Default)]
struct Shadow {
    /// File offset of `buf[0]`, always a frame boundary.
    base: u64,
    buf: Vec<u8>,
    /// Absolute byte ranges `[start, end)` written during the hold, sorted
    /// and merged.
    covered: Vec<(u64, u64)>,
}

impl Shadow {
    fn is_empty(&self) -> bool {
        self.covered.is_empty()
    }

    /// Copies a write at `offset`, which lies in the frame starting at
    /// `start`. Returns whether it landed on bytes this hold had already
    /// written (a page rewritten in place, a checksum rewrite, a rewind).
    fn write(&mut self, offset: u64, start: u64, data: &[u8]) -> bool {
        if data.is_empty() {
            return false;
        }
        if self.is_empty() {
            self.base = start;
            self.buf.clear();
        } else if start < self.base {
            // Never seen from SQLite (it writes forward from mxFrame + 1); kept
            // correct rather than asserted away.
            let grow = (self.base - start) as usize;
            self.buf.splice(0..0, std::iter::repeat_n(0u8, grow));
            self.base = start;
        }
        let rel = (offset - self.base) as usize;
        let end = rel + data.len();
        let overwrite = rel < self.buf.len();
        if rel == self.buf.len() {
            // The usual case, an append: no zero fill before the copy.
            self.buf.extend_from_slice(data);
        } else {
            if self.buf.len() < end {
                self.buf.resize(end, 0);
            }
            self.buf[rel..end].copy_from_slice(data);
        }
        self.cover(offset, offset + data.len() as u64);
        overwrite
    }

    fn cover(&mut self, start: u64, end: u64) {
        // Fast path: SQLite writes sequentially, so almost every write extends
        // or overlaps the last range.
        if let Some(last) = self.covered.last_mut()
            && start >= last.0
            && start <= last.1
        {
            last.1 = last.1.max(end);
            return;
        }
        self.covered.push((start, end));
        self.covered.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(self.covered.len());
        for &(s, e) in &self.covered {
            match merged.last_mut() {
                Some(m) if s <= m.1 => m.1 = m.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        self.covered = merged;
    }

    /// Fills every byte of `[base, base + len)` that the hold did not write
    /// from the file itself.
    fn fill_holes(&mut self, len: u64, disk: &dyn WalReader) -> Result<(), CaptureError> {
        let end = self.base + len;
        if self.buf.len() < len as usize {
            self.buf.resize(len as usize, 0);
        }
        let mut at = self.base;
        let mut holes = Vec::new();
        for &(s, e) in &self.covered {
            if s > at {
                holes.push((at, s.min(end)));
            }
            at = at.max(e);
            if at >= end {
                break;
            }
        }
        if at < end {
            holes.push((at, end));
        }
        for (s, e) in holes {
            if s >= e {
                continue;
            }
            let rel = (s - self.base) as usize;
            let dst = &mut self.buf[rel..rel + (e - s) as usize];
            disk.read_exact_at(dst, s)
                .map_err(|e| CaptureError::Io(e.to_string()))?;
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
struct Hold {
    /// A WAL header written during this hold (a WAL restart or first write).
    new_header: Option<WalHeader>,
    shadow: Shadow,
    /// A write of this hold went past the transaction size limit: every
    /// later write of the hold is refused too, so it cannot commit.
    too_large: bool,
    /// The frames kept in the shadow and not yet written to the file.
    write_behind: WriteBehind,
}

/// The capture state of one database.
#[derive(Debug, Default)]
pub(crate) struct Capture {
    /// The WAL header as last written or read.
    header: Option<WalHeader>,
    /// Salts, frame and checksum of the last captured commit frame: the seed
    /// of the next transaction's checksum chain when it follows directly.
    last_commit: Option<([u32; 2], FrameNo, Checksum)>,
    hold: Option<Hold>,
    poisoned: Option<CaptureError>,
    stats: CaptureStats,
    /// Allocations kept from one hold to the next: the covered-range list
    /// and the per-frame page list.
    spare_covered: Vec<(u64, u64)>,
    spare_frames: Vec<(u32, usize)>,
    /// Shadow buffers come from, and return to, here.
    buffers: Arc<BufferPool>,
    /// The largest transaction, in page-image bytes (None: no limit).
    max_transaction_bytes: Option<u64>,
    /// Set when a hold is refused for its size; taken by the engine to
    /// explain the write's failure.
    refused_too_large: bool,
}

/// Counters of what capture has seen, for tests and operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CaptureStats {
    /// Transactions captured and handed to the sink.
    pub transactions: u64,
    /// Write-lock holds that wrote frames but committed none (rollbacks).
    pub rolled_back_holds: u64,
    /// WAL writes that landed on bytes written earlier in the same hold:
    /// pages rewritten after a spill, `walRewriteChecksums`, savepoint
    /// rewinds.
    pub overwrites: u64,
    /// New WAL headers (first write or restart with new salts).
    pub wal_restarts: u64,
    /// Transactions refused before commit for exceeding the size limit.
    pub too_large_refusals: u64,
    /// Holds that wrote a commit frame SQLite then never published (the
    /// commit failed, e.g. its WAL sync): shipped to nobody.
    pub unpublished_commits: u64,
    /// Writes made to the WAL file: SQLite's own calls that went straight
    /// through, and the writes of runs kept back (see `write_behind`).
    pub wal_file_writes: u64,
}

/// What a WAL write told the capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct WriteNote {
    /// Set when the write contained a commit frame's header: the file
    /// offset where that frame ends.
    pub commit_frame_end: Option<u64>,
}

impl WriteNote {
    /// The write contained a commit frame's header: a transaction is about
    /// to become visible and will be handed to the sink when the hold ends.
    pub fn commit_frame_header(&self) -> bool {
        self.commit_frame_end.is_some()
    }
}

impl Capture {
    pub fn poisoned(&self) -> Option<&CaptureError> {
        self.poisoned.as_ref()
    }

    pub fn stats(&self) -> CaptureStats {
        self.stats
    }

    fn poison(&mut self, e: CaptureError) -> CaptureError {
        if self.poisoned.is_none() {
            self.poisoned = Some(e.clone());
        }
        e
    }

    pub fn poison_with(&mut self, e: CaptureError) {
        let _ = self.poison(e);
    }

    /// The WAL write lock was taken.
    pub fn begin_hold(&mut self) {
        let mut hold = Hold::default();
        hold.shadow.covered = std::mem::take(&mut self.spare_covered);
        hold.shadow.covered.clear();
        self.hold = Some(hold);
    }

    /// Sets the largest transaction, in page-image bytes.
    pub fn set_max_transaction_bytes(&mut self, limit: Option<u64>) {
        self.max_transaction_bytes = limit;
    }

    /// Whether the last refused hold was refused for its size; clears it.
    pub fn take_refused_too_large(&mut self) -> bool {
        std::mem::take(&mut self.refused_too_large)
    }

    /// Whether a WAL write of `len` bytes at `offset` would take this hold's
    /// transaction past the size limit. Checked before the write reaches
    /// the file; once true it stays true for the hold, so SQLite cannot
    /// commit it and rolls it back (the write fails with SQLITE_FULL, which
    /// is not a capture failure: nothing is poisoned).
    pub fn exceeds_limit(&mut self, offset: u64, len: usize) -> bool {
        let Some(limit) = self.max_transaction_bytes else {
            return false;
        };
        let header = self
            .hold
            .as_ref()
            .and_then(|h| h.new_header)
            .or(self.header);
        let Some(hold) = self.hold.as_mut() else {
            return false;
        };
        if hold.too_large {
            return true;
        }
        let Some(header) = header else {
            return false; // the first write of a WAL: its header comes first
        };
        if offset < WAL_HEADER_BYTES as u64 {
            return false;
        }
        let fb = header.frame_bytes();
        let frames_allowed = limit.div_ceil(u64::from(header.page_size));
        let base = if hold.shadow.is_empty() {
            offset - (offset - WAL_HEADER_BYTES as u64) % fb
        } else {
            hold.shadow.base
        };
        let end = offset + len as u64;
        if end.saturating_sub(base) > frames_allowed.saturating_mul(fb) {
            hold.too_large = true;
            self.refused_too_large = true;
            self.stats.too_large_refusals += 1;
            return true;
        }
        false
    }

    /// Whether a WAL write may proceed; checked before the write reaches the
    /// file so that a refused write changes nothing.
    pub fn check_write(&self) -> Result<(), CaptureError> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        if self.hold.is_none() {
            return Err(CaptureError::WriteOutsideHold);
        }
        Ok(())
    }

    fn current_header(&mut self, disk: &dyn WalReader) -> Result<WalHeader, CaptureError> {
        if let Some(h) = self.hold.as_ref().and_then(|h| h.new_header) {
            return Ok(h);
        }
        if let Some(h) = self.header {
            return Ok(h);
        }
        let mut b = [0u8; WAL_HEADER_BYTES];
        disk.read_exact_at(&mut b, 0)
            .map_err(|_| CaptureError::MissingHeader)?;
        let h = WalHeader::decode(&b)?;
        self.header = Some(h);
        Ok(h)
    }

    /// Records a successful WAL write of `data` at `offset`.
    pub fn record_write(
        &mut self,
        offset: u64,
        data: &[u8],
        disk: &dyn WalReader,
    ) -> Result<WriteNote, CaptureError> {
        self.check_write()?;
        self.record_write_inner(offset, data, disk)
            .map_err(|e| self.poison(e))
    }

    fn record_write_inner(
        &mut self,
        offset: u64,
        mut data: &[u8],
        disk: &dyn WalReader,
    ) -> Result<WriteNote, CaptureError> {
        let mut offset = offset;
        if offset < WAL_HEADER_BYTES as u64 {
            if offset != 0 || data.len() < WAL_HEADER_BYTES {
                return Err(CaptureError::UnexpectedHeaderWrite {
                    offset,
                    len: data.len(),
                });
            }
            let h = WalHeader::decode(&data[..WAL_HEADER_BYTES])?;
            if let Some(hold) = self.hold.as_mut() {
                hold.new_header = Some(h);
                // Frames of a previous generation in the shadow are dead.
                hold.shadow = Shadow::default();
            }
            data = &data[WAL_HEADER_BYTES..];
            offset = WAL_HEADER_BYTES as u64;
            if data.is_empty() {
                return Ok(WriteNote::default());
            }
        }
        let header = self.current_header(disk)?;
        let fb = header.frame_bytes();
        let mut note = WriteNote::default();
        // A commit frame's header is written at a frame boundary, at least its
        // first 8 bytes in one call.
        let rel = offset - WAL_HEADER_BYTES as u64;
        let within = rel % fb; // the one division per write
        let frame_start = offset - within;
        if within == 0 && data.len() >= 8 && data[4..8] != [0, 0, 0, 0] {
            note.commit_frame_end = Some(frame_start + fb);
        }
        let hold = self.hold.as_mut().ok_or(CaptureError::WriteOutsideHold)?;
        if hold.shadow.buf.capacity() == 0 {
            // Most transactions are a frame or two.
            hold.shadow.buf = self.buffers.take(2 * fb as usize);
        }
        if hold.shadow.write(offset, frame_start, data) {
            self.stats.overwrites += 1;
        }
        Ok(note)
    }

    /// Where a WAL write of `len` bytes at `offset` goes: kept in the
    /// shadow for now, or written to the file (see `write_behind`).
    pub(crate) fn route(&self, offset: u64, len: usize) -> Route {
        match &self.hold {
            Some(h) => h.write_behind.route(offset, len, WAL_HEADER_BYTES as u64),
            None => Route::Through,
        }
    }

    /// A write routed [`Route::Defer`] was recorded (`note` is what
    /// [`Capture::record_write`] said of it): returns the run of frames due
    /// to be written to the file now, if any.
    pub(crate) fn deferred(
        &mut self,
        offset: u64,
        len: usize,
        note: WriteNote,
    ) -> Option<(u64, u64)> {
        let hold = self.hold.as_mut()?;
        hold.write_behind
            .deferred(offset, len, note.commit_frame_end)
    }

    /// A write routed [`Route::Through`] reached the file and was recorded
    /// (`note` is what [`Capture::record_write`] said of it).
    pub(crate) fn written_through(&mut self, offset: u64, len: usize, note: WriteNote) {
        if let Some(hold) = self.hold.as_mut() {
            hold.write_behind
                .written_through(offset, len, note.commit_frame_end);
        }
    }

    /// The run of frames not yet written to the file, taken to be written
    /// now.
    pub(crate) fn take_run(&mut self) -> Option<(u64, u64)> {
        self.hold.as_mut()?.write_behind.take()
    }

    /// `n` writes reached the WAL file.
    pub(crate) fn count_file_writes(&mut self, n: u64) {
        self.stats.wal_file_writes += n;
    }

    /// Where the run not yet written to the file starts, if there is one.
    pub(crate) fn run_start(&self) -> Option<u64> {
        self.hold.as_ref()?.write_behind.run_start()
    }

    /// The shadow's bytes of a run taken by [`Capture::take_run`] or
    /// returned by [`Capture::deferred`] in this hold.
    /// None if the shadow does not hold it (never, for such a run).
    pub(crate) fn run_bytes(&self, (start, end): (u64, u64)) -> Option<&[u8]> {
        let shadow = &self.hold.as_ref()?.shadow;
        let rel = usize::try_from(start.checked_sub(shadow.base)?).ok()?;
        let len = usize::try_from(end.checked_sub(start)?).ok()?;
        shadow.buf.get(rel..rel.checked_add(len)?)
    }

    /// The WAL file was truncated to `size` bytes (a TRUNCATE checkpoint or a
    /// journal size limit). Cached positions in the old content are void.
    pub fn wal_truncated(&mut self, size: u64) {
        if size < WAL_HEADER_BYTES as u64 {
            self.header = None;
        }
        self.last_commit = None;
    }

    /// The WAL write lock is being released: returns the committed
    /// transaction, if the hold committed one.
    pub fn end_hold(
        &mut self,
        disk: &dyn WalReader,
        published: Option<IndexHeader>,
    ) -> Result<Option<CapturedTransaction>, CaptureError> {
        let Some(mut hold) = self.hold.take() else {
            return Ok(None);
        };
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        let mut result = self.finish(&mut hold, disk, published);
        // A run still kept back is a rollback's frames, which nobody will
        // read. A commit SQLite published must have had every frame in the
        // file before the header named it (the run is written when the
        // commit frame is complete): checked, in release builds too.
        if matches!(result, Ok(Some(_))) && hold.write_behind.run_start().is_some() {
            result = Err(CaptureError::UnwrittenCommit);
        }
        let result = result.map_err(|e| self.poison(e));
        self.spare_covered = std::mem::take(&mut hold.shadow.covered);
        result
    }

    fn finish(
        &mut self,
        hold: &mut Hold,
        disk: &dyn WalReader,
        published: Option<IndexHeader>,
    ) -> Result<Option<CapturedTransaction>, CaptureError> {
        if let Some(h) = hold.new_header {
            self.header = Some(h);
            self.last_commit = None;
            self.stats.wal_restarts += 1;
        }
        if hold.shadow.is_empty() {
            return Ok(None);
        }
        let wal = self.current_header(disk)?;
        let fb = wal.frame_bytes();
        let ps = wal.page_size as usize;
        let shadow = &mut hold.shadow;
        let n_frames = shadow.buf.len() as u64 / fb;

        // Find the commit frame among frames that the hold wrote completely.
        // Scanning headers needs no checksums: a rolled-back hold may leave a
        // stale chain (checksums are only rewritten at commit).
        let mut commit_idx = None;
        for i in 0..n_frames {
            let s = shadow.base + i * fb;
            let fully_written = shadow
                .covered
                .iter()
                .any(|&(a, b)| a <= s && s + FRAME_HEADER_BYTES as u64 <= b);
            if !fully_written {
                continue;
            }
            let at = (i * fb) as usize;
            let h = frame_header_at(&shadow.buf, at);
            if h.is_commit() {
                commit_idx = Some(i);
                break;
            }
        }
        let Some(commit_idx) = commit_idx else {
            self.stats.rolled_back_holds += 1;
            return Ok(None); // rollback: nothing committed
        };
        shadow.fill_holes((commit_idx + 1) * fb, disk)?;

        let base_frame = frame_at(wal.page_size, shadow.base);
        let seed = self.chain_seed(&wal, base_frame, disk)?;

        let buf = self.buffers.freeze(std::mem::take(&mut shadow.buf));
        let mut ck = seed;
        let mut last_by_page = std::mem::take(&mut self.spare_frames);
        last_by_page.clear();
        let mut db_size_pages = 0;
        for i in 0..=commit_idx {
            let frame = FrameNo::new(base_frame.get() + i as u32);
            let at = (i * fb) as usize;
            let h = frame_header_at(&buf, at);
            let page_at = at + FRAME_HEADER_BYTES;
            ck = h.validate(
                &wal,
                frame,
                ck,
                &buf[at..page_at],
                &buf[page_at..page_at + ps],
            )?;
            last_by_page.push((h.page_no, page_at));
            if i == commit_idx {
                db_size_pages = h.commit_db_pages;
            }
        }
        // Last write of each page wins; pages past the new end are gone.
        // SQLite writes each batch of dirty pages in page order, so a
        // transaction without spills is already sorted and unique.
        if !last_by_page.windows(2).all(|w| w[0].0 < w[1].0) {
            last_by_page.reverse();
            last_by_page.sort_by_key(|&(no, _)| no); // stable: latest first per page
            last_by_page.dedup_by_key(|&mut (no, _)| no);
        }
        let pages = last_by_page
            .iter()
            .filter(|&&(no, _)| no <= db_size_pages)
            .map(|&(no, at)| (PageNo::new(no), buf.slice(at..at + ps)))
            .collect();
        self.spare_frames = last_by_page;
        let commit_frame = FrameNo::new(base_frame.get() + commit_idx as u32);
        // SQLite commits a transaction by publishing the wal-index header
        // with mxFrame at its commit frame, after writing (and, at FULL,
        // syncing) the frames. A commit frame on disk whose header was never
        // published is a commit SQLite failed and rolled back: ship nothing.
        if let Some(h) = published
            && !(h.salt_bytes == salt_bytes(wal.salt) && h.max_frame >= commit_frame.get())
        {
            self.stats.unpublished_commits += 1;
            return Ok(None);
        }
        self.last_commit = Some((wal.salt, commit_frame, ck));
        self.stats.transactions += 1;
        Ok(Some(CapturedTransaction {
            pages: PageSet::new(wal.page_size, db_size_pages, pages)?,
            wal: WalPosition {
                salt: wal.salt,
                first_frame: base_frame,
                commit_frame,
            },
        }))
    }

    fn chain_seed(
        &self,
        wal: &WalHeader,
        base: FrameNo,
        disk: &dyn WalReader,
    ) -> Result<Checksum, CaptureError> {
        if base.get() == 1 {
            return Ok(wal.checksum);
        }
        let prev = FrameNo::new(base.get() - 1);
        if let Some((salt, frame, ck)) = self.last_commit
            && salt == wal.salt
            && frame == prev
        {
            return Ok(ck);
        }
        let mut b = [0u8; FRAME_HEADER_BYTES];
        disk.read_exact_at(&mut b, frame_offset(wal.page_size, prev))
            .map_err(|e| CaptureError::Io(e.to_string()))?;
        Ok(FrameHeader::decode(&b).checksum)
    }
}

/// A WAL header's salts as the bytes the wal-index header stores.
fn salt_bytes(salt: [u32; 2]) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&salt[0].to_be_bytes());
    b[4..].copy_from_slice(&salt[1].to_be_bytes());
    b
}

fn frame_header_at(buf: &[u8], at: usize) -> FrameHeader {
    let mut h = [0u8; FRAME_HEADER_BYTES];
    h.copy_from_slice(&buf[at..at + FRAME_HEADER_BYTES]);
    FrameHeader::decode(&h)
}

#[cfg(test)]
#[path = "capture_tests.rs"]
mod tests;
