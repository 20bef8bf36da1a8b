//! A primary's single-statement writes, with group commit: writes that
//! queue while the writer is busy run together in one SQLite transaction,
//! so one WAL commit, one log record and one quorum round serve them all.
//! Who leads a group is [`crate::group_commit`]'s; what a group runs and
//! how it keeps each write's outcome the same as if it had run alone is
//! this module's.
//!
//! # What runs in a group
//!
//! Only a plain DML statement (its first word INSERT, UPDATE, DELETE or
//! REPLACE; SQLite refuses a second statement after it at prepare): it
//! cannot control the transaction or change a connection setting, so it
//! cannot disturb the statements around it. Everything else a client
//! writes takes the writer alone, as before.
//!
//! # Each write's outcome is its own
//!
//! In a group, each statement runs with its own time limit and cancel
//! token, as if inside a savepoint of its own (a group runs its writes
//! without one first and, should one fail, again with one each:
//! [`crate::group_run`]), and is judged as follows:
//! - **It succeeded**: it is released into the group; its result carries
//!   the group's bookmark once the group commits.
//! - **It was stopped** (time limit, cancelled, stopping, response too
//!   large): it would have changed nothing alone either. Its error is its
//!   result, and it does not run again.
//! - **It failed otherwise**: its savepoint is rolled back and it runs
//!   again alone after the group. That keeps SQLite's exact semantics of
//!   a lone statement (with `OR FAIL` a failed statement keeps what it
//!   changed before failing, and a lone statement commits that).
//! - **The transaction itself ended** (SQLite rolled it back: an
//!   interrupt, `RAISE(ROLLBACK)`, `OR ROLLBACK`, a full disk): the
//!   statement is judged as above, and every other one of the group runs
//!   again alone.
//! - **The group's COMMIT failed** (the capture refused the combined
//!   transaction as too large): every statement runs again alone, so a
//!   size refusal is the statement's own.
//!
//! Running alone again is serially equivalent: the group's writers were
//! concurrent, so any order among them is one a client could have seen.
//! Every result and error, as before, waits at the output gate (the
//! caller's thread does that, so later groups commit meanwhile). A
//! member's result is handed back quietly and its thread woken by the
//! confirmation of the group's bookmark, so it wakes once, not twice.

use crate::database::{Database, GROUP_DELAY_SIBLINGS, Output, PrimaryRole};
use crate::error::QueryError;
use crate::execution::CancelToken;
use crate::group_commit::{Leader, Ticket, Turn};
use crate::group_run::{GUARDED_AFTER_FAILURE, Member};
use crate::pool::Pooled;
use crate::value::{Value, value_bytes};
use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Most writes one group commits, and most bytes of statement text and
/// parameters they may bring together: a group's transaction stays about
/// as large as one write's (its pages are also bounded by
/// `max_transaction_bytes`, or it falls back to one transaction each).
pub(crate) const MAX_GROUP: usize = 64;
pub(crate) const MAX_GROUP_BYTES: u64 = 1 << 20;

/// Upper bounds of the buckets that count group commits by how many
/// writes each committed ([`GroupCommitStats::sizes`]); one more bucket
/// counts the larger ones, up to [`MAX_GROUP`].
pub const GROUP_SIZE_BOUNDS: [u64; 10] = [2, 3, 4, 6, 8, 12, 16, 24, 32, 48];

/// The bucket of [`GROUP_SIZE_BOUNDS`] a group of `writes` counts in.
pub(crate) fn size_bucket(writes: u64) -> usize {
    GROUP_SIZE_BOUNDS
        .iter()
        .position(|&bound| writes <= bound)
        .unwrap_or(GROUP_SIZE_BOUNDS.len())
}

/// One write waiting for, or running in, a group.
pub(crate) struct WriteJob<'a> {
    pub(crate) sql: Cow<'a, str>,
    pub(crate) params: Cow<'a, [Value]>,
    pub(crate) cancel: Option<CancelToken>,
    pub(crate) started: Instant,
}

impl WriteJob<'_> {
    /// What the job counts against [`MAX_GROUP_BYTES`].
    fn weight(&self) -> u64 {
        let params: u64 = self
            .params
            .iter()
            .map(|v| value_bytes(v.as_value_ref()))
            .sum();
        self.sql.len() as u64 + params
    }

    pub(crate) fn to_owned(&self) -> WriteJob<'static> {
        WriteJob {
            sql: Cow::Owned(self.sql.clone().into_owned()),
            params: Cow::Owned(self.params.to_vec()),
            cancel: self.cancel.clone(),
            started: self.started,
        }
    }
}

/// The leadership of a group of writes.
pub(crate) type GroupLeader = Leader<WriteJob<'static>, Handback>;

/// A write's outcome before the output gate: a result with its bookmark,
/// or an error not yet settled ([`Database::settle_error`]).
pub(crate) type WriteOutcome = Result<Output, QueryError>;

/// What a group hands one of its members back: the outcome, and for a
/// result, its place at the output gate, counted from the hand-back
/// until the member has passed the gate itself. A member's result is
/// handed back before it is confirmed and its thread sleeps until then;
/// uncounted, most of a group in flight was invisible to the next
/// leader's delay (at 16 sessions, three log records in five carried a
/// single write).
pub(crate) struct Handback {
    pub(crate) outcome: WriteOutcome,
    pub(crate) at_gate: Option<AtGate>,
}

impl Handback {
    /// An outcome not yet counted at the gate.
    pub(crate) fn uncounted(outcome: WriteOutcome) -> Handback {
        Handback {
            outcome,
            at_gate: None,
        }
    }
}

/// A primary's group commit: the queue groups form in, and what they did.
#[derive(Default)]
pub(crate) struct WriteGroups {
    pub(crate) queue: crate::group_commit::GroupQueue<WriteJob<'static>, Handback>,
    /// `Options::group_commit_delay_us`.
    delay: Duration,
    /// Writes waiting at the output gate now (each counted by its
    /// [`AtGate`], a group's members from their [`Handback`]).
    at_gate: Arc<AtomicUsize>,
    groups: AtomicU64,
    grouped_writes: AtomicU64,
    /// Groups by how many writes each committed ([`size_bucket`]).
    sizes: [AtomicU64; GROUP_SIZE_BOUNDS.len() + 1],
    rerun_alone: AtomicU64,
    led_alone: AtomicU64,
    /// Groups still to run guarded from the start ([`crate::group_run`]).
    guarded_left: AtomicU32,
    /// Groups whose unguarded pass was abandoned and ran again guarded.
    guarded_retries: AtomicU64,
}

impl WriteGroups {
    pub(crate) fn new(delay: Duration) -> WriteGroups {
        WriteGroups {
            delay,
            ..WriteGroups::default()
        }
    }

    /// Whether no write waits at the output gate: nothing is in flight,
    /// so no group is about to come back with more writes.
    pub(crate) fn quiet(&self) -> bool {
        self.at_gate.load(Ordering::Relaxed) == 0
    }

    /// Counts a write its leader committed by itself.
    pub(crate) fn led_alone(&self) {
        self.led_alone.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether this group runs its writes unguarded first; a guarded
    /// group uses up one of the turns [`WriteGroups::guard_next_groups`]
    /// set. Only the writer's holder calls this, so the load and the
    /// store cannot race another group's.
    pub(crate) fn unguarded_turn(&self) -> bool {
        let left = self.guarded_left.load(Ordering::Relaxed);
        if left == 0 {
            return true;
        }
        self.guarded_left.store(left - 1, Ordering::Relaxed);
        false
    }

    /// A group's unguarded pass was abandoned: count it, and run the next
    /// [`GUARDED_AFTER_FAILURE`] groups guarded from the start.
    pub(crate) fn guard_next_groups(&self) {
        self.guarded_retries.fetch_add(1, Ordering::Relaxed);
        self.guarded_left
            .store(GUARDED_AFTER_FAILURE, Ordering::Relaxed);
    }

    /// Whether a leader should wait for more writes to queue, and for how
    /// many: enough of them are at the gate, about to come back (Some of
    /// them, at most a group's worth).
    pub(crate) fn worth_waiting(&self) -> Option<usize> {
        let at_gate = self.at_gate.load(Ordering::Relaxed);
        (!self.delay.is_zero() && at_gate >= GROUP_DELAY_SIBLINGS)
            .then_some(at_gate.min(MAX_GROUP - 1))
    }
}

/// Counts a write at the output gate while it lives (a group member's is
/// made by its leader and handed over with its result).
pub(crate) struct AtGate(Option<Arc<AtomicUsize>>);

impl AtGate {
    pub(crate) fn enter(groups: Option<&WriteGroups>) -> AtGate {
        let counter = groups.map(|g| Arc::clone(&g.at_gate));
        if let Some(c) = &counter {
            c.fetch_add(1, Ordering::Relaxed);
        }
        AtGate(counter)
    }
}

impl Drop for AtGate {
    fn drop(&mut self) {
        if let Some(c) = &self.0 {
            c.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// What a primary's group commit has done since it opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupCommitStats {
    /// Transactions that committed two or more writes.
    pub groups: u64,
    /// Writes those transactions committed.
    pub grouped_writes: u64,
    /// Those transactions by how many writes each committed: one count
    /// per bucket of [`GROUP_SIZE_BOUNDS`] (a group of n writes counts in
    /// the first bound at or above n), the last one past them. They add
    /// up to `groups` (each read a moment apart, so within a few).
    pub sizes: [u64; GROUP_SIZE_BOUNDS.len() + 1],
    /// Writes of a group that ran again alone (see the module docs).
    pub rerun_alone: u64,
    /// Writes a leader committed by itself, finding nothing queued: a
    /// transaction, a log record and a quorum round for one write.
    pub led_alone: u64,
    /// Writes waiting at the output gate now, a group's members included
    /// from their hand-back until each has passed the gate (what a
    /// leader's [`crate::Options::group_commit_delay_us`] is judged by).
    pub at_gate: u64,
    /// Groups whose writes ran again, each in a savepoint, after one of
    /// them failed with none ([`crate::group_run`]).
    pub guarded_retries: u64,
}

/// Whether `sql` is a plain DML statement (see the module docs): its first
/// word, after whitespace and comments, is INSERT, UPDATE, DELETE or
/// REPLACE.
pub(crate) fn is_plain_dml(sql: &str) -> bool {
    let mut rest = sql.as_bytes();
    loop {
        match rest {
            [c, tail @ ..] if c.is_ascii_whitespace() => rest = tail,
            [b'-', b'-', tail @ ..] => {
                let end = tail.iter().position(|&c| c == b'\n').unwrap_or(tail.len());
                rest = &tail[end..];
            }
            [b'/', b'*', tail @ ..] => {
                let Some(end) = tail.windows(2).position(|w| w == b"*/") else {
                    return false;
                };
                rest = &tail[end + 2..];
            }
            _ => break,
        }
    }
    let end = rest
        .iter()
        .position(|c| !c.is_ascii_alphabetic())
        .unwrap_or(rest.len());
    let word = &rest[..end];
    ["INSERT", "UPDATE", "DELETE", "REPLACE"]
        .iter()
        .any(|k| word.eq_ignore_ascii_case(k.as_bytes()))
}

impl Database {
    /// What group commit has done on this primary (zero on a replica).
    pub fn group_commit_stats(&self) -> GroupCommitStats {
        let Some(g) = self.primary().and_then(|p| p.write_groups.as_ref()) else {
            return GroupCommitStats::default();
        };
        GroupCommitStats {
            groups: g.groups.load(Ordering::Relaxed),
            grouped_writes: g.grouped_writes.load(Ordering::Relaxed),
            sizes: std::array::from_fn(|i| g.sizes[i].load(Ordering::Relaxed)),
            rerun_alone: g.rerun_alone.load(Ordering::Relaxed),
            led_alone: g.led_alone.load(Ordering::Relaxed),
            at_gate: g.at_gate.load(Ordering::Relaxed) as u64,
            guarded_retries: g.guarded_retries.load(Ordering::Relaxed),
        }
    }

    /// Runs one write statement on the primary's writer, grouped with
    /// others when it is plain DML, and waits at the output gate.
    pub(crate) fn write(
        &self,
        sql: &str,
        params: &[Value],
        access: crate::session::Access,
        started: Instant,
        cancel: Option<&CancelToken>,
    ) -> Result<Output, QueryError> {
        if access == crate::session::Access::ReadOnly {
            return Err(QueryError::ReadOnlyAccess);
        }
        let Some(p) = self.primary() else {
            return Err(QueryError::ReadOnlyReplica);
        };
        p.gate_admit()?;
        let job = WriteJob {
            sql: Cow::Borrowed(sql),
            params: Cow::Borrowed(params),
            cancel: cancel.cloned(),
            started,
        };
        let Handback { outcome, at_gate } = match &p.write_groups {
            Some(groups) if is_plain_dml(sql) => self.write_grouped(p, groups, job),
            _ => Handback::uncounted(self.write_alone(p, job)),
        };
        self.through_gate(p, outcome, at_gate, started)
    }

    /// A write's outcome once the output gate lets it out: a result waits
    /// for its bookmark's confirmation (counted at the gate by `at_gate`,
    /// or from now), an error is settled.
    pub(crate) fn through_gate(
        &self,
        p: &PrimaryRole,
        outcome: WriteOutcome,
        at_gate: Option<AtGate>,
        started: Instant,
    ) -> Result<Output, QueryError> {
        match outcome {
            Ok(mut o) => {
                // Later writers commit while this result waits (pipelining).
                let at_gate = at_gate.unwrap_or_else(|| AtGate::enter(p.write_groups.as_ref()));
                p.gate_wait(o.meta.bookmark)?;
                drop(at_gate);
                o.meta.duration_us = started.elapsed().as_micros() as u64;
                Ok(o)
            }
            Err(e) => Err(self.settle_error(e, false)),
        }
    }

    pub(crate) fn writer_wait(&self) -> Duration {
        Duration::from_millis(self.inner.limits.pool_wait_ms)
    }

    pub(crate) fn writer_busy(&self) -> QueryError {
        QueryError::Busy {
            resource: "the writer",
            waited_ms: self.inner.limits.pool_wait_ms,
        }
    }

    /// One write on the writer by itself (not plain DML).
    fn write_alone(&self, p: &PrimaryRole, job: WriteJob<'_>) -> WriteOutcome {
        let Some(w) = p.writer.try_lock_for(self.writer_wait()) else {
            return Err(self.writer_busy());
        };
        crate::sandbox::reset_if_dirty(&w.conn).map_err(QueryError::sql)?;
        let r = self.run_alone(&w, &job);
        p.maybe_checkpoint(&w.conn.conn);
        r
    }

    /// Submits a plain DML write to the group queue: it runs in the group
    /// this writer leads, or in another's.
    fn write_grouped(&self, p: &PrimaryRole, groups: &WriteGroups, job: WriteJob<'_>) -> Handback {
        match groups.queue.submit(|| job.to_owned(), self.writer_wait()) {
            Turn::Lead(l, _) => Handback::uncounted(self.lead_group(p, groups, l, job)),
            Turn::Done(handback) => handback,
            Turn::TimedOut => Handback::uncounted(Err(self.writer_busy())),
            Turn::Abandoned => Handback::uncounted(Err(QueryError::WriteAbandoned)),
        }
    }

    /// Leads a group with `job` as its first write: gets the writer, takes
    /// what queued, runs it all, and hands each member its outcome.
    pub(crate) fn lead_group(
        &self,
        p: &PrimaryRole,
        groups: &WriteGroups,
        leader: GroupLeader,
        job: WriteJob<'_>,
    ) -> WriteOutcome {
        let wait = self.writer_wait();
        // Giving up (no writer, or a connection that cannot be reset)
        // drops the leadership, which hands it to the oldest queued write.
        let Some(w) = p.writer.try_lock_for(wait) else {
            return Err(self.writer_busy());
        };
        crate::sandbox::reset_if_dirty(&w.conn).map_err(QueryError::sql)?;
        if let Some(want) = groups.worth_waiting() {
            // Holding the writer: what queues meanwhile joins this group.
            // Every write in flight back in the queue ends the wait early.
            leader.gather(want, Instant::now() + groups.delay);
        }
        let others = leader.take(
            MAX_GROUP - 1,
            MAX_GROUP_BYTES.saturating_sub(job.weight()),
            WriteJob::weight,
        );
        if others.is_empty() {
            groups.led_alone();
            let r = self.run_alone(&w, &job);
            p.maybe_checkpoint(&w.conn.conn);
            return r;
        }
        let (tickets, jobs): (Vec<Ticket<_, _>>, Vec<WriteJob<'_>>) = others.into_iter().unzip();
        let mut all = Vec::with_capacity(jobs.len() + 1);
        all.push(job);
        all.extend(jobs);
        let outcomes = self.run_group(p, groups, &w, all);
        p.maybe_checkpoint(&w.conn.conn);
        drop(w);
        let mut outcomes = outcomes.into_iter();
        let own = outcomes.next().expect("one outcome per write");
        for (t, o) in tickets.into_iter().zip(outcomes) {
            // A result waits at the output gate anyway: its writer is woken
            // once, when its bookmark is confirmed, instead of now and
            // again then (errors are settled at once, as before). It
            // counts as at the gate from now (see `Handback`).
            match &o {
                Ok(out) => {
                    let bookmark = out.meta.bookmark;
                    let wakeup = t.complete_quietly(Handback {
                        outcome: o,
                        at_gate: Some(AtGate::enter(Some(groups))),
                    });
                    p.on_confirmed(bookmark, Box::new(move || wakeup.wake()));
                }
                Err(_) => t.complete(Handback::uncounted(o)),
            }
        }
        own
    }

    /// Runs a group's writes (two or more) on the held writer: one
    /// transaction, then the ones that must run alone. One outcome per
    /// write, in order.
    fn run_group(
        &self,
        p: &PrimaryRole,
        g: &WriteGroups,
        w: &Pooled,
        jobs: Vec<WriteJob<'_>>,
    ) -> Vec<WriteOutcome> {
        if w.conn.engine_exec_cached("BEGIN IMMEDIATE").is_err() {
            g.rerun_alone
                .fetch_add(jobs.len() as u64, Ordering::Relaxed);
            return jobs.iter().map(|j| self.run_alone(w, j)).collect();
        }
        let (members, open) = self.run_members(g, w, jobs);
        let committed = open && w.conn.engine_exec_cached("COMMIT").is_ok();
        if !committed {
            if !w.conn.conn.is_autocommit() {
                let _ = w.conn.engine_exec("ROLLBACK");
            }
            // A size refusal of the combined transaction is no single
            // write's: each one alone meets the limit on its own.
            let _ = p.attachment.take_refused_too_large();
        }
        let bookmark = self.latest_bookmark();
        if committed {
            let ran = members
                .iter()
                .filter(|m| matches!(m, Member::Ran(..)))
                .count();
            g.groups.fetch_add(1, Ordering::Relaxed);
            g.grouped_writes.fetch_add(ran as u64, Ordering::Relaxed);
            g.sizes[size_bucket(ran as u64)].fetch_add(1, Ordering::Relaxed);
        }
        members
            .into_iter()
            .map(|m| match m {
                Member::Ran(mut o, _) if committed => {
                    o.meta.bookmark = bookmark;
                    self.check_capture().map(|()| o)
                }
                Member::Ran(_, job) | Member::Again(job) => {
                    g.rerun_alone.fetch_add(1, Ordering::Relaxed);
                    self.run_alone(w, &job)
                }
                Member::Settled(r) => r,
            })
            .collect()
    }

    /// One write in its own transaction on the held writer (autocommit),
    /// as a lone write always ran: a statement that leaves a transaction
    /// open is refused and rolled back.
    pub(crate) fn run_alone(&self, w: &Pooled, job: &WriteJob<'_>) -> WriteOutcome {
        let r = self.run_job(w, job, None);
        self.ran_alone(w, job, r)
    }

    /// [`Database::run_alone`] with the statement's VM work bounded by
    /// `budget` (unless its time limit is shorter): None if the budget
    /// stopped it, which rolled it back whole, so that it changed nothing
    /// and can run again elsewhere with its full time limit. The watch
    /// stops only a statement still running, never one whose commit is
    /// done (`conn_handle::Handle::statement_running`): without that, a
    /// write stopped at SQLite's last check had committed and ran twice.
    pub(crate) fn run_alone_within(
        &self,
        w: &Pooled,
        job: &WriteJob<'_>,
        budget: Duration,
    ) -> Option<WriteOutcome> {
        let r = self.run_job(w, job, Some(budget));
        if r.is_err() && w.watch.over_budget() {
            // Interrupted before its commit: SQLite rolled back the
            // statement's own transaction.
            assert!(
                w.conn.conn.is_autocommit(),
                "a lone write stopped by its budget left a transaction open"
            );
            return None;
        }
        Some(self.ran_alone(w, job, r))
    }

    /// A lone write's outcome from its statement's.
    fn ran_alone(
        &self,
        w: &Pooled,
        job: &WriteJob<'_>,
        r: Result<crate::statement::StatementOutput, QueryError>,
    ) -> WriteOutcome {
        if !w.conn.conn.is_autocommit() {
            let _ = w.conn.engine_exec("ROLLBACK");
            return Err(r.err().unwrap_or_else(crate::statement::tx_control_refused));
        }
        let ran = match r {
            Ok(o) => o,
            // Explained while this write still holds the writer.
            Err(e) => return Err(self.explain(e)),
        };
        self.check_capture()?;
        Ok(self.write_output(w, job.started, self.latest_bookmark(), ran))
    }

    /// A write's result, read off the writer right after its statement
    /// (the row id is the connection's latest).
    pub(crate) fn write_output(
        &self,
        w: &Pooled,
        started: Instant,
        bookmark: crate::Bookmark,
        (columns, rows, counts): crate::statement::StatementOutput,
    ) -> Output {
        let mut meta = self.meta(started, bookmark);
        meta.rows_read = counts.rows_read;
        meta.rows_written = counts.changes;
        meta.changes = counts.changes;
        meta.last_row_id = w.conn.conn.last_insert_rowid();
        Output {
            columns,
            rows,
            meta,
        }
    }
}

#[cfg(test)]
#[path = "group_write_tests.rs"]
pub(crate) mod tests;
