//! A short read run on the calling thread (over HTTP, the async worker)
//! instead of the blocking pool, on a replica or a primary.
//!
//! A point read takes a few microseconds of SQLite work; the hop to the
//! blocking pool and back costs more than that, and the worker that will
//! answer sleeps in epoll meanwhile and must be woken. Here the read runs
//! where the request is, bounded by [`BUDGET`] of VM work: a read that
//! runs over is stopped by its progress handler and declined, and the
//! caller runs it again on the pool, where it may take its full time
//! limit. A read has no side effects, so running it twice changes
//! nothing.
//!
//! # Same outcome as the threaded path
//!
//! [`Database::read_without_thread`] takes only what the threaded path
//! would run as one read at once: one statement (no `;`), not plain DML,
//! not stopping or cancelled, on a replica the
//! session's bookmark already visible (no wait), an idle reader free
//! (neither a wait nor a new connection opened), and a statement that
//! prepares and that SQLite calls read-only. The reader runs it without a
//! busy timeout (a lock it cannot have at once is an error, not a sleep)
//! and with a response limit of [`MAX_RESPONSE_BYTES`]. Anything else, and
//! any error while it runs, declines (`None`) having changed nothing: the
//! threaded path runs it again and gives the error.
//!
//! # The output gate
//!
//! A primary's read may see transactions not yet confirmed, so its result
//! is held ([`HeldRead`]) until its bookmark is: the latest, taken once
//! the read has ended and no commit is between its commit frame and its
//! hand-off to the replicator (if one is, the bookmark is taken on a
//! blocking thread once that settles, as the pool's read takes it: that
//! hand-off may wait, for admission). The task, not a thread,
//! waits for the confirmation, as a grouped write's does
//! ([`crate::group_write_async`]); a confirmation slow to come is waited
//! for on a blocking thread, under the gate's own timeout. A replica's
//! read shows only confirmed state and is released at once.
//!
//! A statement that ran over its budget is remembered ([`LongReads`])
//! and goes straight to the pool after, so a workload of reads just
//! longer than the budget pays for the budget once in
//! [`LONG_READ_RETRY_EVERY`] reads, not every time. That one in so many
//! is tried here again, and a statement that then fits its budget is
//! forgotten: a read that ran over once only because it was the first
//! (cold caches, a descheduled thread) does not stay on the pool.
//!
//! Under a budget the progress handler checks the time every
//! [`crate::execution::BUDGET_CHECK_EVERY_OPS`] VM instructions, not every
//! thousand: one instruction may be costly (a function over a value of
//! up to the 2 MB value limit), so a read is stopped within a few such
//! instructions of its budget.
//!
//! What the budget does not bound is time outside the VM and those few
//! instructions: a filesystem read of a page not in the page cache, or
//! one function over a large value. A database's hot pages are in memory.

use crate::database::{Database, Output, Role};
use crate::error::QueryError;
use crate::execution::{CancelToken, check_start};
use crate::group_write::is_plain_dml;
use crate::statement::{Prepare, prepare, run_prepared};
use crate::value::Value;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use walrelay_replicator::Bookmark;

/// VM work a read may take on the calling thread before it is stopped and
/// handed to the blocking pool.
pub(crate) const BUDGET: Duration = Duration::from_micros(250);

/// The largest result a read on the calling thread may give: a few rows.
/// A larger one (a few large values need few VM steps, and their JSON
/// costs more than they do) is declined and given by the pool.
pub(crate) const MAX_RESPONSE_BYTES: u64 = 64 << 10;

/// Slots of [`LongReads`]: statements remembered at once.
const LONG_READ_SLOTS: usize = 256;

/// A remembered statement is tried on the calling thread again once in
/// this many reads of its slot.
pub(crate) const LONG_READ_RETRY_EVERY: u32 = 64;

/// The statements (by a hash of their text) that ran over [`BUDGET`] on
/// the calling thread: a fixed table, one hash per slot, a newer one
/// taking its slot from an older. Bounded and lock-free; a forgotten
/// statement only costs one more budget.
pub(crate) struct LongReads {
    slots: Box<[AtomicU64]>,
    /// Reads sent to the pool per slot, for the retries.
    skipped: Box<[AtomicU32]>,
    hasher: std::collections::hash_map::RandomState,
}

impl Default for LongReads {
    fn default() -> LongReads {
        LongReads {
            slots: (0..LONG_READ_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            skipped: (0..LONG_READ_SLOTS).map(|_| AtomicU32::new(0)).collect(),
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }
}

impl LongReads {
    /// The statement's key (never 0, which marks an empty slot).
    pub(crate) fn key(&self, sql: &str) -> u64 {
        self.hasher.hash_one(sql).max(1)
    }

    fn index(key: u64) -> usize {
        (key % LONG_READ_SLOTS as u64) as usize
    }

    /// Whether the statement is remembered (a moment's answer).
    #[cfg(test)]
    pub(crate) fn contains(&self, key: u64) -> bool {
        self.slots[Self::index(key)].load(Ordering::Relaxed) == key
    }

    /// Whether a read of the statement goes straight to the pool: it is
    /// remembered, and this is not its turn to be tried here again.
    pub(crate) fn skip(&self, key: u64) -> bool {
        let i = Self::index(key);
        if self.slots[i].load(Ordering::Relaxed) != key {
            return false;
        }
        let n = self.skipped[i].fetch_add(1, Ordering::Relaxed);
        n % LONG_READ_RETRY_EVERY != LONG_READ_RETRY_EVERY - 1
    }

    /// Remembers a statement that ran over its budget.
    pub(crate) fn insert(&self, key: u64) {
        self.slots[Self::index(key)].store(key, Ordering::Relaxed);
    }

    /// Forgets a statement that ran within its budget, if remembered.
    pub(crate) fn forget(&self, key: u64) {
        let slot = &self.slots[Self::index(key)];
        if slot.load(Ordering::Relaxed) == key {
            let _ = slot.compare_exchange(key, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
    }
}

impl Database {
    /// One read run here, if it can be taken now (see the module docs);
    /// `None` declines, and nothing changed. `at_least` is the session's
    /// bookmark. The result is held until [`HeldRead::release`] lets it
    /// through the output gate.
    pub(crate) fn read_without_thread(
        &self,
        sql: &str,
        params: &[Value],
        at_least: Option<Bookmark>,
        cancel: Option<&CancelToken>,
    ) -> Option<HeldRead> {
        let started = Instant::now();
        if sql.contains(';') || is_plain_dml(sql) {
            return None;
        }
        let long_reads = &self.inner.long_reads;
        let long_key = long_reads.key(sql);
        if long_reads.skip(long_key) {
            return None;
        }
        if check_start(&self.inner.stopping, cancel).is_err() {
            return None;
        }
        if let (Role::Replica(replica), Some(b)) = (&self.inner.role, at_least)
            && replica.visible() < b
        {
            return None;
        }
        let reader = self.inner.readers.try_take_idle()?;
        let conn = &reader.conn.conn;
        // Prepared once (the cache's lookup is not free): classified here,
        // then run.
        let stmt = match prepare(conn, sql, Prepare::Cached) {
            Ok(s) if s.readonly() => s,
            _ => return None,
        };
        let limits = self.inner.limits;
        if conn.busy_timeout(Duration::ZERO).is_err() {
            return None;
        }
        let ran = {
            let _armed = reader
                .watch
                .arm_budget(Some(BUDGET), limits.query_timeout_ms, cancel);
            run_prepared(
                &reader,
                stmt,
                params,
                limits.max_response_bytes.min(MAX_RESPONSE_BYTES),
            )
        };
        if conn.busy_timeout(self.inner.reader_busy_timeout).is_err() {
            // A reader that cannot wait for a lock must not go back to
            // the pool: dropped, it closes, and the pool opens another.
            reader.discard();
            return None;
        }
        let over_budget = reader.watch.over_budget();
        if !reader.conn.conn.is_autocommit() {
            // Left a transaction open: the threaded path refuses it.
            let _ = reader.conn.engine_exec("ROLLBACK");
            return None;
        }
        drop(reader);
        if over_budget {
            // Taken to the pool from now on, even if this one finished.
            long_reads.insert(long_key);
        } else if ran.is_ok() {
            long_reads.forget(long_key);
        }
        let (columns, rows, counts) = match ran {
            Ok(o) => o,
            Err(e) => {
                tracing::trace!(error = %e, over_budget, "a read declined here runs on the pool");
                return None;
            }
        };
        // On a primary, what the read saw has reached the sink, and the
        // latest bookmark covers it, unless a commit is between its commit
        // frame and its hand-off (which may wait, for admission): then the
        // bookmark is taken on a blocking thread once that settles.
        let (bookmark, settled) = match &self.inner.role {
            // Raised before a confirm publishes: at least what was read.
            Role::Replica(replica) => (replica.reported(), true),
            // A refused capture left a transaction no bookmark covers:
            // the blocking thread's check answers its error.
            Role::Primary(p) if p.attachment.commit_settled() && self.check_capture().is_ok() => {
                (self.latest_bookmark(), true)
            }
            Role::Primary(_) => (Bookmark::ZERO, false),
        };
        let mut meta = self.meta(started, bookmark);
        meta.rows_read = counts.rows_read;
        Some(HeldRead {
            output: Output {
                columns,
                rows,
                meta,
            },
            started,
            settled,
        })
    }
}

/// A read run on the calling thread, its result not yet given: on a
/// primary it shows what may still be unconfirmed, so it waits at the
/// output gate for its bookmark ([`HeldRead::release`]), as the threaded
/// path's read does.
#[must_use = "a read's result is given only once released through the output gate"]
pub(crate) struct HeldRead {
    output: Output,
    started: Instant,
    /// Whether `output`'s bookmark is its own; if not, a commit was in
    /// hand-off when the read ended, and the bookmark is taken once it
    /// settles.
    settled: bool,
}

impl HeldRead {
    /// The result, once the state it reflects is confirmed: at once on a
    /// replica (it shows only confirmed state) or once confirmed on a
    /// primary, waited for by the task, or by a blocking thread once the
    /// confirmation is slow (the gate's own timeout applies there). A gate
    /// that gives up is the read's error, as on the threaded path.
    pub(crate) async fn release(self, db: Database) -> Result<Output, QueryError> {
        let HeldRead {
            mut output,
            started,
            settled,
        } = self;
        let Some(p) = db.primary() else {
            return Ok(output);
        };
        // The task waits while its bookmark is known and confirmed soon.
        let mine = settled.then_some(output.meta.bookmark);
        let at_once = match mine {
            Some(b) => match p.poll_gate(b) {
                Some(r) => Some(r),
                None => p.confirmed_soon(b).await,
            },
            None => None,
        };
        match at_once {
            Some(r) => r?,
            // A blocking thread waits, under the gate's own timeout: for
            // the bookmark, or (a commit was in hand-off) as the threaded
            // read ends, the commit settling, then its latest bookmark.
            None => {
                let waiting = db.clone();
                output.meta.bookmark = tokio::task::spawn_blocking(move || match mine {
                    Some(b) => waiting
                        .primary()
                        .expect("a primary's role does not change")
                        .gate_wait(b)
                        .map(|()| b),
                    None => waiting.read_bookmark(),
                })
                .await
                // Only a runtime shutting down (or a panic) fails the
                // task: nothing is shown.
                .unwrap_or(Err(QueryError::Stopping))?;
            }
        }
        output.meta.duration_us = started.elapsed().as_micros() as u64;
        Ok(output)
    }
}

#[cfg(test)]
#[path = "read_on_worker_tests.rs"]
mod tests;
