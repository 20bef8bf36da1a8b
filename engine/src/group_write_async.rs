//! A primary's plain DML write waited for by a task instead of a thread.
//!
//! Over HTTP a request otherwise runs on the blocking pool: a hop there
//! and back, and a blocked thread for as long as its group and the output
//! gate take. Most writes under load are group members (see
//! [`crate::group_write`]): they need a thread only to wait. Here such a
//! write is queued from the task, and the task sleeps until its result is
//! handed back and its bookmark confirmed (the confirmation wakes it).
//! Only a write that leads a group, or one whose wait cannot be answered
//! at once, takes a blocking thread.
//!
//! # Same outcome as the threaded path
//!
//! [`Database::write_without_thread`] takes a write only when the threaded
//! path would run it in a group straight away: read-write access, one
//! plain DML statement, a primary with group commit, not stopping or
//! cancelled, no refused capture, and the gate admitting it without a
//! wait. Otherwise it declines (`None`) and changes nothing: the caller
//! runs the write as before, which also gives any error. Once taken, the
//! write meets the same queue, group, savepoint and gate as a threaded
//! one; an error is settled on a blocking thread, as there.

use crate::database::{Database, Output};
use crate::error::QueryError;
use crate::execution::{CancelToken, check_start};
use crate::group_commit::{Entered, QUIET_RECHECK, Queued, Turn};
use crate::group_write::{AtGate, GroupLeader, Handback, WriteJob, WriteOutcome, is_plain_dml};
use crate::read_on_worker::BUDGET;
use crate::session::Access;
use crate::value::Value;
use std::borrow::Cow;
use std::future::Future;
use std::time::{Duration, Instant};

impl Database {
    /// A write to be waited for by a task, if it can be taken now (see
    /// the module docs); `None` declines, and nothing changed.
    pub(crate) fn write_without_thread(
        &self,
        sql: &str,
        params: &[Value],
        access: Access,
        cancel: Option<&CancelToken>,
    ) -> Option<impl Future<Output = Result<Output, QueryError>> + Send + use<>> {
        let started = Instant::now();
        if access != Access::ReadWrite || sql.contains(';') || !is_plain_dml(sql) {
            return None;
        }
        let p = self.primary()?;
        let groups = p.write_groups.as_ref()?;
        if check_start(&self.inner.stopping, cancel).is_err()
            || self.check_capture().is_err()
            || !matches!(p.try_gate_admit(), Some(Ok(())))
        {
            return None;
        }
        // One copy of the write: queued, it comes back with a lead handed
        // to it; leading at once, it is never queued.
        let mut job = Some(WriteJob {
            sql: Cow::Owned(sql.to_owned()),
            params: Cow::Owned(params.to_vec()),
            cancel: cancel.cloned(),
            started,
        });
        let entered = groups.queue.enter(|| job.take().expect("made once"));
        let db = self.clone();
        Some(async move { db.await_write(entered, job, started).await })
    }

    /// `job` is the write when `entered` leads, None when it queued it.
    async fn await_write(
        self,
        entered: Entered<WriteJob<'static>, Handback>,
        job: Option<WriteJob<'static>>,
        started: Instant,
    ) -> Result<Output, QueryError> {
        let turn = match entered {
            Entered::Lead(l) => Turn::Lead(l, None),
            Entered::Queued(q) => wait_turn(q, self.writer_wait()).await,
        };
        let Handback { outcome, at_gate } = match turn {
            Turn::Lead(leader, queued) => {
                let job = queued.or(job).expect("a leader has its write");
                match self.lead_alone_here(leader, job) {
                    Ok(outcome) => Handback::uncounted(outcome),
                    Err((leader, job)) => {
                        let (o, at_gate) = self.lead_on_blocking_thread(leader, job).await?;
                        return self
                            .confirmed_without_thread(o, Some(at_gate), started)
                            .await;
                    }
                }
            }
            Turn::Done(handback) => handback,
            Turn::TimedOut => Handback::uncounted(Err(self.writer_busy())),
            Turn::Abandoned => Handback::uncounted(Err(QueryError::WriteAbandoned)),
        };
        match outcome {
            Ok(o) => self.confirmed_without_thread(o, at_gate, started).await,
            Err(e) => {
                self.on_blocking_thread(move |db| Err(db.settle_error(e, false)))
                    .await
            }
        }
    }

    /// A lone write led on the calling thread: when nothing is queued
    /// behind it or in flight (no write waits at the gate), the writer is
    /// free at once and no checkpoint is due, it runs here as
    /// [`Database::lead_group`] would run it alone. Otherwise the
    /// leadership and the write come back untouched, for a blocking
    /// thread. Under load the hop to that thread is what lets a group
    /// gather (writes answered at a confirmation come back together):
    /// leading each first arrival here made groups of one (16 connections,
    /// 3 pairs: 5,932 against 6,744 requests/s), hence "nothing in flight".
    ///
    /// Here the statement's VM work is bounded by the calling thread's
    /// [`BUDGET`], as a read's is ([`crate::read_on_worker`]): one over it
    /// is interrupted, which rolls it back whole (it runs in autocommit,
    /// so nothing of it commits), and the leadership and the write come
    /// back for the blocking thread, where it runs again with its full time
    /// limit. So no write holds an async worker for longer than a budget
    /// of VM work plus its commit: before, a lone write of seconds held one
    /// of the two workers for as long (the other took over its
    /// connections: `SELECT 1` on 4 connections beside a 5 s write gave
    /// 56,000-69,000 requests/s, 68,000-71,000 with the bound, and no
    /// stall either way; the long write itself then shares the CPU with
    /// them and takes longer). The statement is remembered, as a long read
    /// is, and goes straight to the thread after.
    #[allow(clippy::result_large_err)]
    fn lead_alone_here(
        &self,
        leader: GroupLeader,
        job: WriteJob<'static>,
    ) -> Result<WriteOutcome, (GroupLeader, WriteJob<'static>)> {
        let p = self.primary().expect("a primary's role does not change");
        let groups = p.write_groups.as_ref().expect("group commit is on");
        if !groups.quiet() || !leader.alone() || p.checkpoint_due() {
            return Err((leader, job));
        }
        let long = &self.inner.long_reads;
        let key = long.key(&job.sql);
        if long.skip(key) {
            return Err((leader, job));
        }
        let Some(w) = p.writer.try_lock() else {
            return Err((leader, job));
        };
        if crate::sandbox::reset_if_dirty(&w.conn).is_err() {
            return Err((leader, job)); // the threaded path gives the error
        }
        let Some(outcome) = self.run_alone_within(&w, &job, BUDGET) else {
            long.insert(key);
            drop(w);
            return Err((leader, job));
        };
        long.forget(key);
        // Leadership ends here, as when a leader takes its group: a write
        // queued since leads the next one.
        drop(leader);
        groups.led_alone();
        Ok(outcome)
    }

    /// `o` once its bookmark is confirmed, waited for as a task: at once
    /// if it already is (a group member is woken by its confirmation),
    /// otherwise (a write led here, or one woken by the re-check first)
    /// until the confirmation wakes it or [`QUIET_RECHECK`] passes, when
    /// a blocking thread takes over the wait (bounded by the gate, with
    /// its errors), as the threaded path waits. It counts at the gate by
    /// `at_gate` (a group member's, handed back with its result) or from
    /// when it starts waiting.
    async fn confirmed_without_thread(
        self,
        mut o: Output,
        at_gate: Option<AtGate>,
        started: Instant,
    ) -> Result<Output, QueryError> {
        let p = self.primary().expect("a primary's role does not change");
        let bookmark = o.meta.bookmark;
        let mut at_gate = at_gate;
        let settled = match p.poll_gate(bookmark) {
            Some(r) => Some(r),
            None => {
                // Later writers commit while this result waits (pipelining).
                at_gate.get_or_insert_with(|| AtGate::enter(p.write_groups.as_ref()));
                p.confirmed_soon(bookmark).await
            }
        };
        if let Some(r) = settled {
            drop(at_gate);
            r?;
            o.meta.duration_us = started.elapsed().as_micros() as u64;
            return Ok(o);
        }
        self.on_blocking_thread(move |db| {
            let p = db.primary().expect("a primary's role does not change");
            db.through_gate(p, Ok(o), at_gate, started)
        })
        .await
    }

    /// Leads a group on the blocking pool (the leader may wait for the
    /// writer and for its group to gather, and runs every member's
    /// statement): its unconfirmed result, counted at the gate from the
    /// moment it committed, or its settled error. The confirmation is then
    /// waited for by the task, as a member's is, so no thread sleeps
    /// through the quorum round and the leader is woken with its members:
    /// a blocking thread's sleep and wake-up less per log record.
    async fn lead_on_blocking_thread(
        &self,
        leader: GroupLeader,
        job: WriteJob<'static>,
    ) -> Result<(Output, AtGate), QueryError> {
        self.clone()
            .on_blocking_thread(move |db| {
                let p = db.primary().expect("a primary's role does not change");
                let groups = p.write_groups.as_ref().expect("group commit is on");
                match db.lead_group(p, groups, leader, job) {
                    Ok(o) => Ok((o, AtGate::enter(Some(groups)))),
                    Err(e) => Err(db.settle_error(e, false)),
                }
            })
            .await
    }

    /// Runs `work` on the blocking pool; a panic there answers
    /// [`QueryError::WriteAbandoned`] (whether the write committed is
    /// unknown, as when a group's leader goes away).
    async fn on_blocking_thread<T: Send + 'static>(
        self,
        work: impl FnOnce(&Database) -> Result<T, QueryError> + Send + 'static,
    ) -> Result<T, QueryError> {
        tokio::task::spawn_blocking(move || work(&self))
            .await
            .unwrap_or(Err(QueryError::WriteAbandoned))
    }
}

/// Waits for a queued write's turn: at most `wait` to be taken (then it
/// leaves the queue, [`Turn::TimedOut`]), then for its result, looking at
/// least every [`QUIET_RECHECK`] for one handed back quietly.
async fn wait_turn<J, R>(mut q: Queued<J, R>, wait: Duration) -> Turn<J, R> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let turn = std::future::poll_fn(|cx| q.poll_turn(cx));
        let tick = tokio::time::Instant::now() + QUIET_RECHECK;
        if let Ok(turn) = tokio::time::timeout_at(tick, turn).await {
            return turn;
        }
        if tokio::time::Instant::now() >= deadline && q.withdraw() {
            return Turn::TimedOut;
        }
    }
}

#[cfg(test)]
#[path = "group_write_async_tests.rs"]
mod tests;
