//! A primary's output gate (admission, waiting for confirmation) and its
//! checkpoints.

use super::{CheckpointMode, CheckpointStats, PrimaryRole};
use crate::error::{CheckpointError, QueryError};
use crate::group_commit::QUIET_RECHECK;
use rusqlite::{Connection, ffi};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use walrelay_replicator::Bookmark;

impl PrimaryRole {
    pub(crate) fn gate_admit(&self) -> Result<(), QueryError> {
        match &self.gate {
            Some(g) => g
                .admit_write()
                .map_err(|reason| QueryError::WriteNotAdmitted { reason }),
            None => Ok(()),
        }
    }

    /// [`Self::gate_admit`] if it need not wait; None if it would.
    pub(crate) fn try_gate_admit(&self) -> Option<Result<(), QueryError>> {
        match &self.gate {
            Some(g) => Some(
                g.try_admit_write()?
                    .map_err(|reason| QueryError::WriteNotAdmitted { reason }),
            ),
            None => Some(Ok(())),
        }
    }

    /// [`Self::gate_wait`] if it need not wait; None if it would.
    pub(crate) fn poll_gate(&self, bookmark: Bookmark) -> Option<Result<(), QueryError>> {
        match &self.gate {
            Some(g) => Some(
                g.poll_confirmed(bookmark)?
                    .map_err(|reason| QueryError::NotConfirmed { bookmark, reason }),
            ),
            None => Some(Ok(())),
        }
    }

    pub(crate) fn gate_wait(&self, bookmark: Bookmark) -> Result<(), QueryError> {
        match &self.gate {
            Some(g) => g
                .wait_confirmed(bookmark)
                .map_err(|reason| QueryError::NotConfirmed { bookmark, reason }),
            None => Ok(()),
        }
    }

    /// See [`CommitGate::on_confirmed`]; at once without a gate.
    pub(crate) fn on_confirmed(&self, bookmark: Bookmark, wake: Box<dyn FnOnce() + Send>) {
        match &self.gate {
            Some(g) => g.on_confirmed(bookmark, wake),
            None => wake(),
        }
    }

    /// Waits as a task for `bookmark`'s confirmation, at most
    /// [`QUIET_RECHECK`], then polls the gate: `None` if it would still
    /// wait (the caller then waits on a blocking thread with
    /// [`Self::gate_wait`], under the gate's own timeout).
    pub(crate) async fn confirmed_soon(
        &self,
        bookmark: Bookmark,
    ) -> Option<Result<(), QueryError>> {
        let confirmed = Arc::new(tokio::sync::Notify::new());
        let notify = Arc::clone(&confirmed);
        self.on_confirmed(bookmark, Box::new(move || notify.notify_one()));
        let _ = tokio::time::timeout(QUIET_RECHECK, confirmed.notified()).await;
        self.poll_gate(bookmark)
    }

    /// Whether the next [`Self::maybe_checkpoint`] would checkpoint.
    pub(crate) fn checkpoint_due(&self) -> bool {
        self.issuer.last_commit_frame.load(Ordering::Relaxed) >= self.checkpoint_threshold_frames
    }

    pub(crate) fn maybe_checkpoint(&self, conn: &Connection) {
        if self.checkpoint_due() {
            // Busy is fine: the next commit tries again.
            let _ = checkpoint_on(conn, CheckpointMode::Passive);
        }
    }
}

pub(crate) fn checkpoint_on(
    conn: &Connection,
    mode: CheckpointMode,
) -> Result<CheckpointStats, CheckpointError> {
    let m = match mode {
        CheckpointMode::Passive => ffi::SQLITE_CHECKPOINT_PASSIVE,
        CheckpointMode::Full => ffi::SQLITE_CHECKPOINT_FULL,
        CheckpointMode::Restart => ffi::SQLITE_CHECKPOINT_RESTART,
        CheckpointMode::Truncate => ffi::SQLITE_CHECKPOINT_TRUNCATE,
    };
    let (mut log, mut ckpt) = (0, 0);
    // SAFETY: the handle belongs to a live connection that the caller holds
    // exclusively (behind the writer mutex) for the duration of the call;
    // the schema name is a valid NUL-terminated string.
    let rc = unsafe {
        ffi::sqlite3_wal_checkpoint_v2(conn.handle(), c"main".as_ptr(), m, &mut log, &mut ckpt)
    };
    match rc {
        ffi::SQLITE_OK => Ok(CheckpointStats {
            wal_frames: log.max(0) as u32,
            backfilled_frames: ckpt.max(0) as u32,
        }),
        ffi::SQLITE_BUSY => Err(CheckpointError::Busy),
        code => Err(CheckpointError::Sqlite { code }),
    }
}
