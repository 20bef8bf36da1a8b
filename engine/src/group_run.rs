//! How a group's writes run inside its one transaction, each with the
//! outcome it would have had alone (the rules are in
//! [`crate::group_write`]'s module docs).
//!
//! A write needs a savepoint of its own only if it fails: the savepoint is
//! what takes a failed write's changes back out of the group's
//! transaction, and a successful write is simply kept. So a group first
//! runs its writes **unguarded**, one after another with nothing around
//! each. If every one succeeds, that is the group. The first one that
//! fails (or a transaction SQLite ended) abandons the pass: the whole
//! transaction is rolled back, and the group runs again from its first
//! write in a fresh transaction, **guarded** (each write in its own
//! savepoint, judged as the module docs say). A write the unguarded pass
//! saw stopped (a time limit, a cancel, a stop, a response over its
//! limit) is settled with that error and not run again; it would have
//! changed nothing alone either.
//!
//! The rolled-back pass changed nothing anyone saw: the writer is held
//! throughout, and its rollback is SQLite's own, as when a group cannot
//! commit; the guarded pass starts from the same database. After a group
//! that had to run again, the next [`GUARDED_AFTER_FAILURE`] groups run
//! guarded from the start, so a workload whose writes often fail pays
//! the savepoints rather than two passes.
//!
//! A savepoint and its release cost about 1.2 us a write (SQLite's
//! statement programs, and the savepoint's copy of each page the write
//! changes that the group changed before it). Measured (papers/
//! performance.md, lever 69): in process at 16 sessions, 1.053x
//! commits/s and 0.956x CPU per commit (medians of 12 paired rounds);
//! over HTTP at 16 connections, within the noise.

use crate::database::{Database, Output};
use crate::error::QueryError;
use crate::execution::CancelToken;
use crate::group_write::{WriteGroups, WriteJob, WriteOutcome};
use crate::pool::Pooled;
use crate::statement::{Prepare, run_statement};
use std::time::Duration;

/// Groups that run guarded from the start after one had to run again.
pub(crate) const GUARDED_AFTER_FAILURE: u32 = 16;

/// Errors after which a statement changed nothing and would fail the same
/// way alone: it is not run again.
pub(crate) fn stopped(e: &QueryError) -> bool {
    matches!(
        e,
        QueryError::Timeout { .. }
            | QueryError::Cancelled
            | QueryError::Stopping
            | QueryError::ResponseTooLarge { .. }
    )
}

/// How a member of a running group fared.
pub(crate) enum Member<'a> {
    /// Released into the group's transaction; its result lacks only the
    /// bookmark. Runs again alone if the group does not commit.
    Ran(Output, WriteJob<'a>),
    /// Its outcome is final.
    Settled(WriteOutcome),
    /// Runs again alone after the group.
    Again(WriteJob<'a>),
}

impl Database {
    /// Runs a group's writes in the transaction the caller began on the
    /// held writer: one member per write, in order, and whether the
    /// transaction is still open (to be committed).
    pub(crate) fn run_members<'a>(
        &self,
        g: &WriteGroups,
        w: &Pooled,
        jobs: Vec<WriteJob<'a>>,
    ) -> (Vec<Member<'a>>, bool) {
        if !g.unguarded_turn() {
            return self.run_guarded(w, jobs.into_iter().map(Member::Again).collect(), true);
        }
        let members = match self.run_unguarded(w, jobs) {
            Ok(members) => return (members, true),
            Err(members) => members,
        };
        // Abandoned: nothing of the pass is kept.
        g.guard_next_groups();
        if !w.conn.conn.is_autocommit() {
            let _ = w.conn.engine_exec("ROLLBACK");
        }
        // No transaction to run them in: each runs alone after the group.
        let open = w.conn.engine_exec_cached("BEGIN IMMEDIATE").is_ok();
        self.run_guarded(w, members, open)
    }

    /// The unguarded pass: every write ran and the transaction is open
    /// (Ok), or the pass was abandoned at the first write that did not
    /// run (Err): the members to run again guarded, the stopped one
    /// settled, in order.
    fn run_unguarded<'a>(
        &self,
        w: &Pooled,
        jobs: Vec<WriteJob<'a>>,
    ) -> Result<Vec<Member<'a>>, Vec<Member<'a>>> {
        let mut members: Vec<Member<'_>> = Vec::with_capacity(jobs.len());
        let mut jobs = jobs.into_iter();
        while let Some(job) = jobs.next() {
            if job.cancel.as_ref().is_some_and(CancelToken::is_cancelled) {
                // It never ran: nothing to take back.
                members.push(Member::Settled(Err(QueryError::Cancelled)));
                continue;
            }
            let failed = match self.run_job(w, &job, None) {
                Ok(ran) => {
                    assert!(
                        !w.conn.conn.is_autocommit(),
                        "a DML statement ended its group's transaction without an error"
                    );
                    let o = self.write_output(w, job.started, crate::Bookmark::ZERO, ran);
                    members.push(Member::Ran(o, job));
                    continue;
                }
                Err(e) if stopped(&e) => Member::Settled(Err(e)),
                Err(_) => Member::Again(job),
            };
            members.push(failed);
            members.extend(jobs.map(Member::Again));
            return Err(members);
        }
        Ok(members)
    }

    /// The guarded pass in the transaction if `open`: each member with a
    /// job runs in its own savepoint; settled members pass through. Once
    /// there is no transaction (never begun, or ended by SQLite), the
    /// members not yet run run alone after the group.
    fn run_guarded<'a>(
        &self,
        w: &Pooled,
        todo: Vec<Member<'a>>,
        mut open: bool,
    ) -> (Vec<Member<'a>>, bool) {
        let mut members: Vec<Member<'_>> = Vec::with_capacity(todo.len());
        for m in todo {
            let job = match m {
                Member::Ran(_, job) | Member::Again(job) => job,
                settled @ Member::Settled(_) => {
                    members.push(settled);
                    continue;
                }
            };
            if !open {
                members.push(Member::Again(job));
                continue;
            }
            let (member, still_open) = self.run_member(w, job);
            members.push(member);
            open = still_open;
        }
        (members, open)
    }

    /// Runs one member of an open group transaction in its own savepoint;
    /// returns how it fared and whether the transaction is still open.
    fn run_member<'a>(&self, w: &Pooled, job: WriteJob<'a>) -> (Member<'a>, bool) {
        if job.cancel.as_ref().is_some_and(CancelToken::is_cancelled) {
            return (Member::Settled(Err(QueryError::Cancelled)), true);
        }
        if w.conn
            .engine_exec_cached("SAVEPOINT walrelay_group")
            .is_err()
        {
            return (Member::Again(job), !w.conn.conn.is_autocommit());
        }
        let r = self.run_job(w, &job, None);
        if w.conn.conn.is_autocommit() {
            // SQLite rolled the whole transaction back.
            assert!(
                r.is_err(),
                "a DML statement ended its group's transaction without an error"
            );
            return match r {
                Err(e) if stopped(&e) => (Member::Settled(Err(e)), false),
                _ => (Member::Again(job), false),
            };
        }
        let (member, undo) = match r {
            Ok(ran) => {
                // The bookmark is the group's, set once it commits.
                let o = self.write_output(w, job.started, crate::Bookmark::ZERO, ran);
                (Member::Ran(o, job), false)
            }
            Err(e) if stopped(&e) => (Member::Settled(Err(e)), true),
            Err(_) => (Member::Again(job), true),
        };
        let end = if undo {
            w.conn
                .engine_exec("ROLLBACK TO walrelay_group; RELEASE walrelay_group")
        } else {
            w.conn.engine_exec_cached("RELEASE walrelay_group")
        };
        if end.is_err() {
            // The transaction is in an unknown state: end it, and run
            // every member again alone.
            let _ = w.conn.engine_exec("ROLLBACK");
            let member = match member {
                Member::Ran(_, job) => Member::Again(job),
                m => m,
            };
            return (member, false);
        }
        (member, true)
    }

    /// Runs a job's statement on the held writer under its own time limit
    /// and cancel token, and `budget` if given ([`crate::execution::Watch::arm_budget`]).
    pub(crate) fn run_job(
        &self,
        w: &Pooled,
        job: &WriteJob<'_>,
        budget: Option<Duration>,
    ) -> Result<crate::statement::StatementOutput, QueryError> {
        let limits = self.inner.limits;
        let _armed = w
            .watch
            .arm_budget(budget, limits.query_timeout_ms, job.cancel.as_ref());
        // The row id reported is this statement's insert, never an
        // earlier writer's (the writer connection is shared).
        crate::statement::forget_last_row_id(&w.conn.conn);
        run_statement(
            w,
            &job.sql,
            &job.params,
            Prepare::Cached,
            limits.max_response_bytes,
        )
    }
}
