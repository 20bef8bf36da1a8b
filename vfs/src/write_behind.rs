//! Write-behind of a hold's frames: which WAL writes may wait in the
//! capture's shadow, and when they must reach the file. Free of I/O: the
//! shim asks [`WriteBehind::route`] what to do with a write and performs
//! the writes this module says are due.
//!
//! SQLite writes each WAL frame as two calls, its 24-byte header and then
//! its page, so a one-row insert (two frames) costs four `pwrite`s on the
//! WAL. The capture already copies every byte of a hold into its shadow
//! (`capture`), so those bytes need not go to the file one call at a time:
//! a run of frames written forward is kept back and written as one `pwrite`
//! of the shadow's bytes once the commit frame is complete.
//!
//! What this must not change is what anyone reads from the WAL file:
//! - no reader of another connection reads a frame before SQLite publishes
//!   it in the wal-index header, and SQLite publishes a commit only after
//!   its commit frame's write returned. The run is written when the write
//!   that completes the commit frame arrives, before that write returns;
//!   every later write of the hold goes straight through.
//! - the writing connection may read its own unpublished frames back (a
//!   spilled page, `walRewriteChecksums`): a read that reaches the run, a
//!   sync, a size query or a truncation of the WAL writes the run first.
//! - a write that does not extend the run or land inside it (the WAL
//!   header, a frame behind the run) writes the run first, then itself.
//!
//! A run also goes to the file once it reaches [`MAX_RUN_BYTES`], so a
//! large transaction streams to the WAL as before, in larger writes. A hold
//! that ends without a commit (a rollback) drops its run unwritten: SQLite
//! never publishes those frames and the next hold writes over their place.

/// The longest run of frames kept back before it is written.
pub(crate) const MAX_RUN_BYTES: u64 = 1 << 20;

/// What to do with one WAL write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// Copy it into the shadow only; it joins (or starts) the run.
    Defer,
    /// Write the run first (if there is one), then this write to the file.
    Through,
}

/// The run of a hold's WAL bytes held in the shadow and not yet in the file.
#[derive(Debug, Default)]
pub(crate) struct WriteBehind {
    /// `[start, end)` file offsets of the run.
    run: Option<(u64, u64)>,
    /// The end offset of the commit frame this hold has begun to write.
    commit_end: Option<u64>,
    /// The commit frame is complete: the rest of the hold writes through.
    through: bool,
}

impl WriteBehind {
    /// Where a write of `len` bytes at `offset` goes. `frames_from` is the
    /// first frame's offset (the WAL header's size): anything before it is
    /// the header and always written through.
    pub(crate) fn route(&self, offset: u64, len: usize, frames_from: u64) -> Route {
        if self.through || offset < frames_from || len == 0 {
            return Route::Through;
        }
        let end = offset + len as u64;
        match self.run {
            None => Route::Defer,
            Some((s, e)) if offset == e || (offset >= s && end <= e) => Route::Defer,
            Some(_) => Route::Through,
        }
    }

    /// A write routed [`Route::Defer`] is in the shadow. `commit_end` is
    /// the end of the commit frame when this write held its header.
    /// Returns the run when it is now due: the commit frame is complete, or
    /// the run reached [`MAX_RUN_BYTES`].
    pub(crate) fn deferred(
        &mut self,
        offset: u64,
        len: usize,
        commit_end: Option<u64>,
    ) -> Option<(u64, u64)> {
        let end = offset + len as u64;
        let run = match self.run {
            None => (offset, end),
            Some((s, e)) => (s, e.max(end)),
        };
        self.run = Some(run);
        self.note_commit(commit_end);
        match self.commit_end {
            Some(c) if run.1 >= c => {
                self.through = true;
                self.run.take()
            }
            _ if run.1 - run.0 >= MAX_RUN_BYTES => self.run.take(),
            _ => None,
        }
    }

    /// A write routed [`Route::Through`] is in the file (after the run it
    /// found). `commit_end` as for [`WriteBehind::deferred`]: a commit
    /// frame's header may go straight through (behind the run, or past a
    /// gap), and its page, which follows, must then not wait either.
    pub(crate) fn written_through(&mut self, offset: u64, len: usize, commit_end: Option<u64>) {
        self.note_commit(commit_end);
        if self.commit_end.is_some_and(|c| offset + len as u64 >= c) {
            self.through = true;
        }
    }

    /// The first commit frame's end, once a write holds its header.
    fn note_commit(&mut self, commit_end: Option<u64>) {
        if self.commit_end.is_none() {
            self.commit_end = commit_end;
        }
    }

    /// The run, to be written now (a read, sync, size query, truncation or
    /// a write routed [`Route::Through`] needs the file whole).
    pub(crate) fn take(&mut self) -> Option<(u64, u64)> {
        self.run.take()
    }

    /// The start of the run, if there is one: a read below it never needs
    /// it written.
    pub(crate) fn run_start(&self) -> Option<u64> {
        self.run.map(|(s, _)| s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HDR: u64 = 32;
    /// A frame of a 4096-byte page: its 24-byte header, then the page.
    const FB: u64 = 24 + 4096;

    /// Writes frame `i` as SQLite does (header, then page); returns the
    /// runs that came due.
    fn frame(wb: &mut WriteBehind, i: u64, commit: bool) -> Vec<(u64, u64)> {
        let at = HDR + i * FB;
        let mut due = Vec::new();
        for (off, len, commit_end) in [
            (at, 24usize, commit.then_some(at + FB)),
            (at + 24, 4096, None),
        ] {
            assert_eq!(wb.route(off, len, HDR), Route::Defer, "frame {i} at {off}");
            due.extend(wb.deferred(off, len, commit_end));
        }
        due
    }

    #[test]
    fn a_two_frame_commit_goes_to_the_file_as_one_write_when_its_commit_frame_is_complete() {
        let mut wb = WriteBehind::default();
        assert!(frame(&mut wb, 0, false).is_empty());
        assert_eq!(wb.run_start(), Some(HDR));
        assert_eq!(frame(&mut wb, 1, true), vec![(HDR, HDR + 2 * FB)]);
        assert_eq!(wb.run_start(), None);
    }

    #[test]
    fn after_the_commit_frame_every_write_of_the_hold_goes_straight_through() {
        let mut wb = WriteBehind::default();
        frame(&mut wb, 0, true);
        // Sector padding: copies of the commit frame past it.
        assert_eq!(wb.route(HDR + FB, 24, HDR), Route::Through);
    }

    #[test]
    fn the_wal_header_is_always_written_through() {
        let wb = WriteBehind::default();
        assert_eq!(wb.route(0, 32, HDR), Route::Through);
    }

    #[test]
    fn a_write_inside_the_run_stays_in_it_and_one_elsewhere_writes_the_run_first() {
        let mut wb = WriteBehind::default();
        frame(&mut wb, 3, false);
        frame(&mut wb, 4, false);
        let (s, e) = (HDR + 3 * FB, HDR + 5 * FB);
        // A page rewritten in place, or a header's checksum rewritten.
        assert_eq!(wb.route(s + 24, 4096, HDR), Route::Defer);
        assert_eq!(wb.deferred(s + 24, 4096, None), None);
        // A frame behind the run, or past a gap after it.
        assert_eq!(wb.route(HDR, 24, HDR), Route::Through);
        assert_eq!(wb.route(e + FB, 24, HDR), Route::Through);
        assert_eq!(wb.take(), Some((s, e)));
        assert_eq!(wb.take(), None);
    }

    #[test]
    fn a_rewound_hold_whose_run_already_reaches_past_the_commit_frame_writes_it_at_the_header() {
        let mut wb = WriteBehind::default();
        for i in 0..4 {
            frame(&mut wb, i, false);
        }
        // Rolled back to a savepoint after frame 0: frame 1 is rewritten as
        // the commit frame, inside the run.
        let at = HDR + FB;
        assert_eq!(wb.route(at, 24, HDR), Route::Defer);
        assert_eq!(
            wb.deferred(at, 24, Some(at + FB)),
            Some((HDR, HDR + 4 * FB))
        );
        assert_eq!(wb.route(at + 24, 4096, HDR), Route::Through);
    }

    #[test]
    fn a_commit_frame_whose_header_went_straight_through_has_its_page_written_at_once() {
        let mut wb = WriteBehind::default();
        frame(&mut wb, 0, false);
        frame(&mut wb, 1, false);
        // A spilled page rewritten in place (frame 0's page): a new run.
        assert_eq!(wb.take(), Some((HDR, HDR + 2 * FB)));
        assert_eq!(wb.route(HDR + 24, 4096, HDR), Route::Defer);
        assert_eq!(wb.deferred(HDR + 24, 4096, None), None);
        // The commit frame (frame 2) is past a gap: its header goes through.
        let at = HDR + 2 * FB;
        assert_eq!(wb.route(at, 24, HDR), Route::Through);
        assert_eq!(wb.take(), Some((HDR + 24, HDR + FB)));
        wb.written_through(at, 24, Some(at + FB));
        // Its page starts a run that is due at once.
        assert_eq!(wb.route(at + 24, 4096, HDR), Route::Defer);
        assert_eq!(wb.deferred(at + 24, 4096, None), Some((at + 24, at + FB)));
        assert_eq!(wb.route(at + FB, 24, HDR), Route::Through);
    }

    #[test]
    fn a_large_transaction_streams_in_runs_of_at_most_the_bound() {
        let mut wb = WriteBehind::default();
        let mut runs = Vec::new();
        let frames = 3 * MAX_RUN_BYTES / FB;
        for i in 0..frames {
            runs.extend(frame(&mut wb, i, i + 1 == frames));
        }
        assert!(runs.len() >= 3, "{runs:?}");
        let mut next = HDR;
        for &(s, e) in &runs {
            assert_eq!(s, next, "runs follow each other without a gap");
            assert!(e - s < MAX_RUN_BYTES + FB);
            next = e;
        }
        assert_eq!(
            next,
            HDR + frames * FB,
            "the last run ends at the commit frame's end"
        );
    }
}
