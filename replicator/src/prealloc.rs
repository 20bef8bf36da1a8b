//! Preallocated segment files, and preparing the next one ahead of need.
//!
//! Both logs (the per-database [`SegmentLog`](crate::segments::SegmentLog)
//! and the host's [`SharedLog`](crate::shared_log::SharedLog)) create each
//! segment really preallocated: zeros written over its whole size and
//! synced once, so every later sync into it is a pure overwrite (no block
//! allocation or unwritten-extent conversion for the journal to commit),
//! about twice as fast as a sync that allocates. A segment is built under
//! a temporary name, `<index:016x>.seg.tmp`, and renamed into place only
//! whole, so a crash never leaves a short segment behind (recovery removes
//! a leftover `.seg.tmp`).
//!
//! The fill writes back as it goes, a chunk at a time, rather than
//! leaving the whole segment to its closing sync: every follower of a
//! cluster fills at about the same moment, and five 64 MiB bursts at once
//! held their log syncs (and so the quorum) for tens of milliseconds.
//! Where the filesystem takes direct I/O the chunks are direct writes
//! (see `direct_io`), which reach the disk as they are made; elsewhere
//! they go through the page cache, each written back behind the next
//! (`sync_file_range`).
//!
//! Zero-filling and syncing a 64 MiB segment takes 100 ms and more; done
//! inline at the roll it stalls the follower's transport thread, and every
//! follower of a cluster rolls at the same record. So once the active
//! segment is an eighth written, a log starts a [`Spare`]: the next segment,
//! built on a thread of its own. The roll takes it (waiting for it if it is
//! still running) when it was made for the index and at least the size the
//! roll needs, and otherwise discards it and builds the segment inline as
//! before. A failed preparation is not an error by itself: the roll then
//! builds inline, and reports that attempt's error if it fails too.
//!
//! A spare's fill is paced by the log it is for ([`fill_pace`]): spread
//! over the active segment from an eighth of the way through to seven
//! eighths, a chunk of 64 KiB at a time, so about 1.3 bytes of zeros go to
//! the disk per byte of log (filled over the second half's first three
//! fifths, as before lever 62, it was 3.3 bytes, and the five followers'
//! fills together held the disk at 17 times the log's rate).
//!
//! The pace says two things: what the fill *may* have written (the
//! schedule plus a lead of two chunks; a small spare all of it) and what
//! it *must* have written (the schedule itself; a small spare all of it
//! once the active segment is half written). What it may write but need
//! not, it writes only while the log is quiet: nothing appended for
//! [`QUIET`]. A follower a round trip away from its leader waits that long
//! between records, so its zeros go to the disk in those gaps rather than
//! beside the next record's sync (lever 81, papers/performance.md); a
//! busy log's fill keeps to the schedule, as before.
//! Each spare's allowance is also offset by a random part of a chunk
//! (its stagger, in whole blocks): the followers of a cluster get the same
//! records, and without it they wrote each chunk at the same moment.
//! Unpaced, five followers filling 64 MiB each at once kept the disk
//! saturated for about a second at every roll (every 64 MiB of log), and
//! the quorum's syncs queued behind the zeros: over HTTP at one
//! connection, windows of 47-92 requests over 3 ms (up to 40 ms) every
//! 8-10 s (papers/performance.md, lever 46). The roll that needs a spare
//! still being filled lifts the pace and waits for it.
//!
//! None of this is needed once a log has released segments: a roll then
//! reuses one of them, already written, and writes no zeros at all
//! ([`crate::recycle`]); a log prepares no spare while its pool holds a
//! segment for the next roll.
//!
//! A log holds at most one spare, and replacing or dropping one cancels and
//! joins its thread and removes its file before anything else happens: two
//! preparations of one index never run at once, and a log reopened in the
//! same directory never shares a `.seg.tmp` with a thread still writing it.

use crate::direct_io::{self, Padded};
use crate::segments::SegmentError;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Zeros written per call while filling a segment: what a log sync may
/// find queued ahead of it on the disk, per follower filling. 64 KiB
/// rather than 256 (lever 76, papers/performance.md): in the quorum
/// bench's fresh log, whose followers fill their spares as it runs, the
/// one-session p99 was about 0.88x with the smaller writes.
const CHUNK: u64 = 64 << 10;
/// Spares smaller than this are not paced by the schedule: all of one may
/// be filled at once, and must be from half the active segment on.
const PACE_MIN_BYTES: u64 = 2 << 20;
/// How far a paced fill may run ahead of the log's progress.
const PACE_LEAD_BYTES: u64 = 2 * CHUNK;
/// A spare starts once an eighth of the active segment is written
/// (`active_size / SPARE_START_DIVISOR`)...
const SPARE_START_DIVISOR: u64 = 8;
/// ...and its fill spans this many eighths more: all of it is written by
/// seven eighths of the way through the active segment.
const FILL_SPAN_EIGHTHS: u64 = 6;
/// How long a log must have appended nothing for its spare to write what
/// it may but need not yet (see the module docs): longer than a record's
/// sync takes, shorter than a round trip to another region.
const QUIET: Duration = Duration::from_millis(1);
/// A small spare must be filled once the active segment is this fraction
/// written (`active_size / SMALL_DUE_DIVISOR`); before that only while the
/// log is quiet. Half leaves the fill the other half of a small segment's
/// records before the roll would wait for it.
const SMALL_DUE_DIVISOR: u64 = 2;
/// How soon a paced fill that is ahead looks at the log's progress again;
/// the wait doubles while the log does not move, up to `PACE_POLL_MAX`
/// (a spare of a log that went idle costs a wake-up a second).
const PACE_POLL: Duration = Duration::from_millis(10);
const PACE_POLL_MAX: Duration = Duration::from_secs(1);

/// What a `size`-byte spare may and must have filled once the active
/// segment (`active_size` bytes) holds `written`.
///
/// A large spare: nothing before the spare starts (an eighth of the way
/// through the active segment), then in proportion to the log's progress,
/// all of it by seven eighths of the way through; it may run a lead of two
/// chunks ahead of that. A small one may be filled at once, and must be
/// once the active segment is half written.
pub(crate) fn fill_pace(size: u64, written: u64, active_size: u64) -> Allowance {
    let start = active_size / SPARE_START_DIVISOR;
    if start == 0 {
        return Allowance::all(size);
    }
    if size < PACE_MIN_BYTES {
        let half_written = written.saturating_mul(SMALL_DUE_DIVISOR) >= active_size;
        return Allowance {
            may: size,
            must: if half_written { size } else { 0 },
        };
    }
    let into = u128::from(written.saturating_sub(start));
    let span = u128::from(start * FILL_SPAN_EIGHTHS);
    let paced = (u128::from(size) * into / span).min(u128::from(size)) as u64;
    Allowance {
        may: paced.saturating_add(PACE_LEAD_BYTES).min(size),
        must: paced,
    }
}

/// How far a spare's fill may go while its log is quiet (`may`) and must
/// go now (`must`, at most `may`), in bytes from the segment's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Allowance {
    pub(crate) may: u64,
    pub(crate) must: u64,
}

impl Allowance {
    /// Nothing yet (a spare just started, before its log's pace).
    pub(crate) const NONE: Allowance = Allowance { may: 0, must: 0 };

    /// All of a `size`-byte spare, now.
    pub(crate) fn all(size: u64) -> Allowance {
        Allowance {
            may: size,
            must: size,
        }
    }
}

/// What a spare's fill may do now: how many bytes it may write while the
/// log is quiet, how many it must have written, when the log last
/// appended, and whether to give up.
#[derive(Debug)]
pub(crate) struct Pace {
    may: AtomicU64,
    must: AtomicU64,
    cancel: AtomicBool,
    /// When the log last appended: µs after `born`.
    touched_us: AtomicU64,
    born: Instant,
    /// [`QUIET`] (tests lengthen it to outlast a busy machine's pauses).
    quiet_us: AtomicU64,
}

impl Pace {
    fn new(allowed: Allowance) -> Pace {
        Pace {
            may: AtomicU64::new(allowed.may),
            must: AtomicU64::new(allowed.must),
            cancel: AtomicBool::new(false),
            touched_us: AtomicU64::new(0),
            born: Instant::now(),
            quiet_us: AtomicU64::new(QUIET.as_micros() as u64),
        }
    }

    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// The log appended a record.
    fn touch(&self) {
        self.touched_us.store(self.now_us(), Ordering::Relaxed);
    }

    /// Whether the log has appended nothing for [`QUIET`].
    fn quiet(&self) -> bool {
        let since = self
            .now_us()
            .saturating_sub(self.touched_us.load(Ordering::Relaxed));
        since >= self.quiet_us.load(Ordering::Relaxed)
    }

    /// Whether the fill may write up to `upto` bytes now: they are due, or
    /// allowed and the log is quiet.
    fn may_write(&self, upto: u64) -> bool {
        self.must.load(Ordering::Relaxed) >= upto
            || (self.may.load(Ordering::Relaxed) >= upto && self.quiet())
    }

    /// Blocks until `upto` bytes may be written, or the fill is cancelled.
    fn wait_for(&self, upto: u64) {
        let mut poll = PACE_POLL;
        let mut seen = self.may.load(Ordering::Relaxed);
        while !self.may_write(upto) && !self.cancelled() {
            std::thread::park_timeout(poll);
            let now = self.may.load(Ordering::Relaxed);
            // Allowed but held back by a busy log: look again at the
            // same cadence as while the log moves.
            poll = if now != seen || now >= upto {
                PACE_POLL
            } else {
                (poll * 2).min(PACE_POLL_MAX)
            };
            seen = now;
        }
    }
}

fn io_at(path: &Path) -> impl Fn(io::Error) -> SegmentError + '_ {
    move |source| SegmentError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Where segment `path` is built before it is renamed into place.
pub(crate) fn tmp_path(path: &Path) -> PathBuf {
    path.with_extension("seg.tmp")
}

/// Whether `name` is a segment under construction (left by a crash when
/// found at open).
pub(crate) fn is_tmp_name(name: &str) -> bool {
    name.ends_with(".seg.tmp")
}

/// Creates (truncating) `tmp`, writes `size` bytes of zeros and syncs it,
/// each chunk once `pace` allows it. Gives up, with an `Interrupted`
/// error, once `pace` is cancelled (checked between chunks: a discarded
/// spare stops within a chunk's write).
pub(crate) fn zero_filled(
    tmp: &Path,
    size: u64,
    pace: Option<&Pace>,
) -> Result<File, SegmentError> {
    let cancelled = || pace.is_some_and(Pace::cancelled);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(tmp)
        .map_err(io_at(tmp))?;
    // Whole blocks go through a direct descriptor where the filesystem
    // takes one: no page cache to fill, copy into and write back (about
    // 9 ms of CPU per 64 MiB against 22 here), and each write is paced by
    // the disk itself. What is left (a size that is not whole blocks, or
    // no direct I/O) is written through the page cache, a chunk at a time
    // behind `write_back`.
    let direct = direct_io::open(tmp).map_err(io_at(tmp))?;
    let zeros = Padded::zeros(size.min(CHUNK) as usize);
    let mut at = 0u64;
    while at < size {
        let n = (size - at).min(CHUNK) as usize;
        if let Some(p) = pace {
            p.wait_for(at + n as u64);
        }
        if cancelled() {
            return Err(io_at(tmp)(io::Error::new(
                io::ErrorKind::Interrupted,
                "segment preparation cancelled",
            )));
        }
        let whole_blocks = n as u64 % direct_io::BLOCK == 0;
        match &direct {
            Some(d) if whole_blocks => {
                d.write_all_at(&zeros.as_slice()[..n], at)
                    .map_err(io_at(tmp))?;
            }
            _ => {
                file.write_all_at(&zeros.as_slice()[..n], at)
                    .map_err(io_at(tmp))?;
                write_back(&file, at, n as u64).map_err(io_at(tmp))?;
            }
        }
        at += n as u64;
    }
    // The closing sync flushes the disk's cache like a log sync: it too
    // waits for a quiet log or for being due.
    if let Some(p) = pace {
        p.wait_for(size);
    }
    if cancelled() {
        return Err(io_at(tmp)(io::Error::new(
            io::ErrorKind::Interrupted,
            "segment preparation cancelled",
        )));
    }
    file.sync_all().map_err(io_at(tmp))?;
    Ok(file)
}

/// Starts writing back the chunk just written at `at` and waits for the
/// one before it: the fill's dirty data stays about two chunks, so it
/// trickles out at the disk's pace instead of one burst of the whole
/// segment at the closing sync, which every follower of a cluster would
/// otherwise issue at once and which stalls their log syncs behind it.
fn write_back(file: &File, at: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let range = |offset: u64, n: u64, flags| {
        // SAFETY: sync_file_range only reads its integer arguments; `fd`
        // is open for the whole call (borrowed from `file`).
        let rc = unsafe { libc::sync_file_range(fd, offset as i64, n as i64, flags) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    range(at, len, libc::SYNC_FILE_RANGE_WRITE)?;
    if let Some(prev) = at.checked_sub(CHUNK) {
        range(
            prev,
            CHUNK,
            libc::SYNC_FILE_RANGE_WAIT_BEFORE
                | libc::SYNC_FILE_RANGE_WRITE
                | libc::SYNC_FILE_RANGE_WAIT_AFTER,
        )?;
    }
    Ok(())
}

/// A segment created by [`create_segment`].
#[derive(Debug)]
pub(crate) struct Created {
    pub(crate) file: File,
    /// Its size: the one asked for, or a prepared spare's (at least that).
    pub(crate) size: u64,
    /// Whether it was prepared ahead by a [`Spare`].
    pub(crate) from_spare: bool,
}

/// Creates segment `index` at `path` in `dir`, zero-filled to at least
/// `size` bytes and synced, and syncs the directory: from `spare` if it was
/// prepared for this index and size, else inline (the spare, if any, is
/// discarded first).
pub(crate) fn create_segment(
    dir: &Path,
    path: &Path,
    index: u64,
    size: u64,
    spare: Option<Spare>,
) -> Result<Created, SegmentError> {
    let tmp = tmp_path(path);
    // Taken (or dropped: joined, its file removed) before the inline path
    // reuses the same temporary name.
    let prepared = spare.and_then(|s| s.take(index, size));
    let (file, size, from_spare) = match prepared {
        Some((file, spare_size)) => (file, spare_size, true),
        None => (zero_filled(&tmp, size, None)?, size, false),
    };
    std::fs::rename(&tmp, path).map_err(io_at(path))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_at(dir))?;
    Ok(Created {
        file,
        size,
        from_spare,
    })
}

/// Whether a log whose active segment of `active_size` bytes has `written`
/// bytes is past the point where its next segment is prepared ahead.
pub(crate) fn spare_due(written: u64, active_size: u64) -> bool {
    written.saturating_mul(SPARE_START_DIVISOR) >= active_size
}

/// Once the active segment is an eighth written (`written` of `active_size`
/// bytes), makes sure `spare` is (being) built for segment `index` of
/// `size` bytes, to be at `path()`: the index and size the next roll would
/// ask for. Any other spare is discarded first (joined, its file removed):
/// never two preparations of one index at once. Cheap when nothing is to
/// be done (called after every append).
pub(crate) fn keep_ready(
    spare: &mut Option<Spare>,
    written: u64,
    active_size: u64,
    index: u64,
    size: u64,
    path: impl FnOnce() -> PathBuf,
) {
    if !spare_due(written, active_size) {
        return;
    }
    if !spare.as_ref().is_some_and(|s| s.is_for(index, size)) {
        *spare = None;
        *spare = Spare::start_paced(&path(), index, size, Allowance::NONE);
    }
    if let Some(s) = spare {
        s.pace(fill_pace(size, written, active_size));
    }
}

/// Discards `spare` unless it was made for segment `index`, the one the
/// next roll creates (after a cut moved a log back, it would only sit on
/// disk until replaced).
pub(crate) fn keep_only_for(spare: &mut Option<Spare>, index: u64) {
    if spare.as_ref().is_some_and(|s| s.index() != index) {
        *spare = None;
    }
}

/// The next segment, being built (or built) ahead of need on a thread of
/// its own under its temporary name (see the module docs). Dropping it
/// cancels and joins the thread and removes the file.
#[derive(Debug)]
pub(crate) struct Spare {
    index: u64,
    size: u64,
    tmp: PathBuf,
    pace: Arc<Pace>,
    /// Added to every allowance: a random part of a chunk, so the
    /// followers of a cluster, which get the same records, write their
    /// chunks at different moments rather than all together.
    stagger: u64,
    /// None once joined; then `outcome` says how it went.
    thread: Option<JoinHandle<Result<(), SegmentError>>>,
    outcome: Option<Result<(), String>>,
    /// Set once the roll took the file: it is no longer ours to remove.
    taken: bool,
}

impl Spare {
    /// Starts building segment `index` (to be at `path`) of `size` bytes,
    /// unpaced. None if no thread could be started: the roll then builds
    /// inline.
    #[cfg(test)]
    pub(crate) fn start(path: &Path, index: u64, size: u64) -> Option<Spare> {
        Spare::start_paced(path, index, size, Allowance::all(u64::MAX))
    }

    /// [`Spare::start`], with what may and must be filled before
    /// [`Spare::pace`] says more.
    fn start_paced(path: &Path, index: u64, size: u64, allowed: Allowance) -> Option<Spare> {
        let tmp = tmp_path(path);
        let pace = Arc::new(Pace::new(allowed));
        let (t, c) = (tmp.clone(), Arc::clone(&pace));
        let spawned = std::thread::Builder::new()
            .name("walrelay-spare".into())
            .spawn(move || {
                // At normal priority, unlike archive uploads: a roll waits
                // for this thread on the follower's transport thread, so
                // starving it (a busy host, nice 10) stalls every commit
                // and, past the transport's write timeout, drops the
                // follower from the quorum (a CI run lost all five so).
                // The file is closed once built: a spare costs no
                // descriptor while it waits (a host keeps many logs), and
                // the roll reopens it by name.
                zero_filled(&t, size, Some(c.as_ref())).map(drop)
            });
        match spawned {
            Ok(thread) => {
                tracing::debug!(segment = index, size, "preparing the next segment ahead");
                Some(Spare {
                    index,
                    size,
                    tmp,
                    pace,
                    stagger: rand::random_range(0..CHUNK / direct_io::BLOCK) * direct_io::BLOCK,
                    thread: Some(thread),
                    outcome: None,
                    taken: false,
                })
            }
            Err(e) => {
                tracing::debug!(segment = index, error = %e, "no thread to prepare the next segment: the roll builds it inline");
                None
            }
        }
    }

    /// Whether its preparation has ended (built, failed or cancelled):
    /// taking it then waits for nothing.
    pub(crate) fn is_done(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Whether it is being made for exactly segment `index` of `size`
    /// bytes (what the next roll would ask for now).
    pub(crate) fn is_for(&self, index: u64, size: u64) -> bool {
        self.index == index && self.size == size
    }

    pub(crate) fn index(&self) -> u64 {
        self.index
    }

    /// The log appended a record, and its fill may and must now go as far
    /// as `allowed` says (neither ever moves back). Wakes the fill when
    /// all of it falls due (a small spare's comes all at once).
    pub(crate) fn pace(&self, allowed: Allowance) {
        self.pace.touch();
        let at = |n: u64| n.saturating_add(self.stagger).min(self.size);
        self.pace.may.fetch_max(at(allowed.may), Ordering::Relaxed);
        let must = at(allowed.must);
        let before = self.pace.must.fetch_max(must, Ordering::Relaxed);
        if before < self.size
            && must >= self.size
            && let Some(thread) = &self.thread
        {
            thread.thread().unpark();
        }
    }

    /// Waits for the preparation to end, unpaced from here; whether it
    /// built the file.
    pub(crate) fn wait(&mut self) -> bool {
        if let Some(thread) = self.thread.take() {
            self.pace.may.store(u64::MAX, Ordering::Relaxed);
            self.pace.must.store(u64::MAX, Ordering::Relaxed);
            thread.thread().unpark();
            self.outcome = Some(match thread.join() {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("the preparing thread panicked".into()),
            });
        }
        matches!(self.outcome, Some(Ok(())))
    }

    /// The built file (still under its temporary name) and its size, for
    /// a roll to segment `index` needing `size` bytes: waits for it if it
    /// is still being built. None if it was made for another index, is too
    /// small, or failed: it is then discarded (its file removed).
    fn take(mut self, index: u64, size: u64) -> Option<(File, u64)> {
        if self.index != index || self.size < size {
            tracing::debug!(
                spare = self.index,
                spare_size = self.size,
                segment = index,
                size,
                "the prepared segment does not fit this roll: built inline"
            );
            return None;
        }
        let ok = self.wait();
        if !ok {
            if let Some(Err(why)) = &self.outcome {
                tracing::warn!(segment = index, error = %why, "preparing the next segment failed: built inline");
            }
            return None;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.tmp)
            .and_then(|f| {
                // Built whole (a stray truncation would leave a short
                // segment, read back as a torn one).
                let len = f.metadata()?.len();
                if len == self.size {
                    Ok(f)
                } else {
                    Err(io::Error::other(format!(
                        "prepared as {} bytes, found {len}",
                        self.size
                    )))
                }
            });
        match file {
            Ok(f) => {
                self.taken = true;
                Some((f, self.size))
            }
            Err(e) => {
                tracing::warn!(segment = index, error = %e, "the prepared segment cannot be used: built inline");
                None
            }
        }
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        self.pace.cancel.store(true, Ordering::Relaxed);
        self.wait();
        if !self.taken {
            // Best effort: a leftover is removed at the next open.
            match std::fs::remove_file(&self.tmp) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::debug!(path = %self.tmp.display(), error = %e, "a discarded spare segment was not removed")
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "prealloc_tests.rs"]
mod tests;
