//! What stops a running statement: its deadline, its caller's cancel
//! token, or the database stopping.
//!
//! Every connection carries a [`Watch`] that its SQLite progress handler
//! consults every [`CHECK_EVERY_OPS`] virtual-machine instructions (every
//! [`BUDGET_CHECK_EVERY_OPS`] under a budget; the handler runs that often
//! and counts its calls in between). The
//! engine arms the watch for the length of one execution (a statement, or a
//! whole batch) with a deadline and the caller's [`CancelToken`]; when the
//! handler fires, SQLite ends the statement with `SQLITE_INTERRUPT` (a
//! write's transaction is rolled back) and [`Watch::explain`] turns that
//! into the typed reason.
//!
//! How late it acts: a check costs one clock read, so a statement is
//! stopped within a few microseconds of VM work after its deadline or
//! cancellation. Time spent outside the VM (waiting on a lock, inside one
//! long sort step, a filesystem call) is not interrupted until it returns
//! to the VM.

use crate::conn_handle::Handle;
use crate::error::QueryError;
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// VM instructions between two checks of the watch.
pub(crate) const CHECK_EVERY_OPS: u32 = 1_024;

/// VM instructions between two checks of a watch armed with a budget
/// ([`Watch::arm_budget`]): the progress handler's own interval. A budget
/// is short, and one instruction can be costly (a function over a value
/// of megabytes), so it is checked more often.
pub(crate) const BUDGET_CHECK_EVERY_OPS: u32 = 16;

/// A statement running longer than this yields its core at every check,
/// so that short queries and woken writers do not queue behind CPU-bound
/// long ones (it costs the long statement one `sched_yield` per check).
pub(crate) const LONG_RUNNING_MS: u64 = 50;

/// Cancels the statement or batch it was given to (D1 has no such handle;
/// the HTTP server uses one per request and cancels it when the client
/// goes away). Cheap to clone; every clone is the same token. A token made
/// with [`CancelToken::child`] is also cancelled by its parent.
#[derive(Debug, Clone, Default)]
pub struct CancelToken {
    own: Arc<AtomicBool>,
    parent: Option<Arc<AtomicBool>>,
}

impl CancelToken {
    pub fn new() -> CancelToken {
        CancelToken::default()
    }

    /// A token cancelled by itself or by `self`.
    pub fn child(&self) -> CancelToken {
        CancelToken {
            own: Arc::new(AtomicBool::new(false)),
            parent: Some(Arc::clone(&self.own)),
        }
    }

    /// Stops whatever runs under this token (and its children), now and
    /// from now on.
    pub fn cancel(&self) {
        self.own.store(true, Ordering::Release);
    }

    pub fn is_cancelled(&self) -> bool {
        self.own.load(Ordering::Acquire)
            || self
                .parent
                .as_ref()
                .is_some_and(|p| p.load(Ordering::Acquire))
    }
}

/// Why the progress handler stopped a statement.
const FIRED_NONE: u8 = 0;
const FIRED_DEADLINE: u8 = 1;
const FIRED_CANCELLED: u8 = 2;
const FIRED_STOPPING: u8 = 3;
/// The deadline was a budget, not the caller's limit
/// ([`Watch::arm_budget`]).
const FIRED_BUDGET: u8 = 4;

/// One execution's bounds.
struct Armed {
    started: Instant,
    deadline: Instant,
    cancel: Option<CancelToken>,
}

/// What one connection's progress handler checks.
pub(crate) struct Watch {
    armed: Mutex<Option<Armed>>,
    fired: AtomicU8,
    /// The last armed timeout, for the error message.
    timeout_ms: AtomicU64,
    /// Database-wide: set once the database stops taking queries.
    stopping: Arc<AtomicBool>,
    /// The handler's calls, to check only every [`CHECK_EVERY_OPS`].
    calls: AtomicU32,
    /// Armed with a budget (a deadline shorter than the caller's limit):
    /// check at every call.
    budgeted: AtomicBool,
}

impl Watch {
    pub(crate) fn new(stopping: Arc<AtomicBool>) -> Arc<Watch> {
        Arc::new(Watch {
            armed: Mutex::new(None),
            fired: AtomicU8::new(FIRED_NONE),
            timeout_ms: AtomicU64::new(0),
            stopping,
            calls: AtomicU32::new(0),
            budgeted: AtomicBool::new(false),
        })
    }

    /// Installs the progress handler on `conn`.
    pub(crate) fn install(
        self: &Arc<Watch>,
        conn: &mut rusqlite::Connection,
    ) -> rusqlite::Result<()> {
        let w = Arc::clone(self);
        let db = Handle::of(conn);
        conn.progress_handler(BUDGET_CHECK_EVERY_OPS as i32, Some(move || w.called(db)))
    }

    /// The progress handler: a full check at every call under a budget,
    /// otherwise at every [`CHECK_EVERY_OPS`] instructions.
    fn called(&self, db: Handle) -> bool {
        const CALLS: u32 = CHECK_EVERY_OPS / BUDGET_CHECK_EVERY_OPS;
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        if n % CALLS != CALLS - 1 && !self.budgeted.load(Ordering::Relaxed) {
            return false;
        }
        self.check(db)
    }

    /// Whether the running statement must stop (the progress handler's
    /// answer; true interrupts).
    fn check(&self, db: Handle) -> bool {
        // Only an armed execution stops: the engine's own statements
        // (ROLLBACK after a failure, COMMIT) run unarmed and always finish.
        let mut long_running = false;
        let why = match &*self.armed.lock() {
            None => FIRED_NONE,
            Some(_) if self.stopping.load(Ordering::Relaxed) => FIRED_STOPPING,
            Some(a) if a.cancel.as_ref().is_some_and(CancelToken::is_cancelled) => FIRED_CANCELLED,
            Some(a) => {
                let now = Instant::now();
                if now >= a.deadline && self.budgeted.load(Ordering::Relaxed) {
                    FIRED_BUDGET
                } else if now >= a.deadline {
                    FIRED_DEADLINE
                } else {
                    long_running =
                        now.duration_since(a.started) >= Duration::from_millis(LONG_RUNNING_MS);
                    FIRED_NONE
                }
            }
        };
        if why == FIRED_NONE {
            if long_running {
                std::thread::yield_now();
            }
            return false;
        }
        if !db.statement_running() {
            // SQLite's last call as a statement returns, after OP_Halt
            // ended it (committing it, if it wrote alone): an interrupt
            // here would report a committed statement as stopped.
            return false;
        }
        self.fired.store(why, Ordering::Relaxed);
        true
    }

    /// Bounds everything run on this connection until the guard drops.
    pub(crate) fn arm(&self, timeout_ms: u64, cancel: Option<&CancelToken>) -> ArmGuard<'_> {
        self.arm_budget(None, timeout_ms, cancel)
    }

    /// [`Watch::arm`], stopping the execution early once `budget` has run
    /// if that comes before `timeout_ms`: [`Watch::over_budget`] then says
    /// so, and the caller runs it again where it may take its full time.
    pub(crate) fn arm_budget(
        &self,
        budget: Option<Duration>,
        timeout_ms: u64,
        cancel: Option<&CancelToken>,
    ) -> ArmGuard<'_> {
        self.fired.store(FIRED_NONE, Ordering::Relaxed);
        self.timeout_ms.store(timeout_ms, Ordering::Relaxed);
        let now = Instant::now();
        let limit = Duration::from_millis(timeout_ms);
        let budget = budget.filter(|b| *b < limit);
        self.budgeted.store(budget.is_some(), Ordering::Relaxed);
        *self.armed.lock() = Some(Armed {
            started: now,
            deadline: now + budget.unwrap_or(limit),
            cancel: cancel.cloned(),
        });
        ArmGuard { watch: self }
    }

    /// Whether the last armed execution was stopped by its budget.
    pub(crate) fn over_budget(&self) -> bool {
        self.fired.load(Ordering::Relaxed) == FIRED_BUDGET
    }

    /// The typed reason for an error the progress handler caused; any
    /// other error is passed through.
    pub(crate) fn explain(&self, e: QueryError) -> QueryError {
        let interrupted = matches!(&e, QueryError::Sql { code: Some(c), .. }
            if *c & 0xff == rusqlite::ffi::SQLITE_INTERRUPT);
        if !interrupted {
            return e;
        }
        match self.fired.load(Ordering::Relaxed) {
            FIRED_DEADLINE => {
                let limit_ms = self.timeout_ms.load(Ordering::Relaxed);
                tracing::info!(limit_ms, "a query ran past its time limit and was stopped");
                QueryError::Timeout { limit_ms }
            }
            FIRED_CANCELLED => {
                tracing::debug!("a query was cancelled (its client went away)");
                QueryError::Cancelled
            }
            FIRED_STOPPING => QueryError::Stopping,
            _ => e,
        }
    }
}

/// Disarms its watch when dropped.
#[must_use]
pub(crate) struct ArmGuard<'w> {
    watch: &'w Watch,
}

impl Drop for ArmGuard<'_> {
    fn drop(&mut self) {
        self.watch.budgeted.store(false, Ordering::Relaxed);
        *self.watch.armed.lock() = None;
    }
}

/// Refuses to start an execution that is already cancelled or whose
/// database is stopping.
pub(crate) fn check_start(
    stopping: &AtomicBool,
    cancel: Option<&CancelToken>,
) -> Result<(), QueryError> {
    if stopping.load(Ordering::Acquire) {
        return Err(QueryError::Stopping);
    }
    if cancel.is_some_and(CancelToken::is_cancelled) {
        return Err(QueryError::Cancelled);
    }
    Ok(())
}

#[cfg(test)]
#[path = "execution_tests.rs"]
mod tests;
