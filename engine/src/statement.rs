//! Running statements: where each runs (a reader or the writer), what
//! bounds it (a deadline, the caller's cancel token, the response size, a
//! bounded wait for its connection), and when its result — an error
//! included — may be released (the output gate).
//!
//! - SQLite classifies a statement (`sqlite3_stmt_readonly`) on an idle
//!   reader, which then runs it if it reads; when every reader is busy a
//!   dedicated classifier connection prepares it instead, so a write never
//!   waits behind reads to be classified.
//! - A prepare error may come from a connection's stale cached schema
//!   (another connection changed it; SQLite re-checks the schema cookie at
//!   prepare time only for some errors, such as "no such table"): it is
//!   retried once after the schema is checked against the database.
//! - On a replicated primary an error can reveal unconfirmed state (a
//!   UNIQUE violation against an unconfirmed row): errors wait at the gate
//!   like results do.

use crate::database::{Database, Output, PrimaryRole, Role};
use crate::error::QueryError;
use crate::execution::{CancelToken, check_start};
use crate::pool::{Lease, Pooled};
use crate::session::Access;
use crate::split::Cursor;
use crate::value::{Row, Value, value_bytes};
use parking_lot::MutexGuard;
use rusqlite::{Connection, StatementStatus};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use walrelay_replicator::Bookmark;

pub(crate) struct Counts {
    pub(crate) rows_read: u64,
    pub(crate) changes: u64,
}

pub(crate) type StatementOutput = (Arc<[String]>, Vec<Row>, Counts);

/// How a statement is prepared. Batch statements are prepared fresh so the
/// authorizer judges each one inside the batch: a cached statement is not
/// authorized again.
#[derive(Clone, Copy)]
pub(crate) enum Prepare {
    Cached,
    Fresh,
}

/// A prepared statement, from the cache or not.
pub(crate) enum Prepared<'c> {
    Cached(rusqlite::CachedStatement<'c>),
    Fresh(rusqlite::Statement<'c>),
}

impl<'c> std::ops::Deref for Prepared<'c> {
    type Target = rusqlite::Statement<'c>;
    fn deref(&self) -> &rusqlite::Statement<'c> {
        match self {
            Prepared::Cached(s) => s,
            Prepared::Fresh(s) => s,
        }
    }
}

impl<'c> std::ops::DerefMut for Prepared<'c> {
    fn deref_mut(&mut self) -> &mut rusqlite::Statement<'c> {
        match self {
            Prepared::Cached(s) => s,
            Prepared::Fresh(s) => s,
        }
    }
}

fn prepare_once<'c>(
    conn: &'c Connection,
    sql: &str,
    how: Prepare,
) -> rusqlite::Result<Prepared<'c>> {
    match how {
        Prepare::Cached => conn.prepare_cached(sql).map(Prepared::Cached),
        Prepare::Fresh => conn.prepare(sql).map(Prepared::Fresh),
    }
}

/// Prepares `sql` against the current schema.
///
/// A connection prepares against the schema it has cached in memory. When
/// another connection (the writer, or a replica's applier) has changed the
/// schema since, SQLite notices at prepare time only for errors that name
/// something missing; an error such as "table t has 5 columns but 6 values
/// were supplied" comes from the stale copy. So a plain `SQLITE_ERROR` is
/// retried once after stepping a statement that reads the schema: its
/// `OP_Transaction` compares the schema cookie and reloads a stale schema.
pub(crate) fn prepare<'c>(
    conn: &'c Connection,
    sql: &str,
    how: Prepare,
) -> rusqlite::Result<Prepared<'c>> {
    crate::split::refuse_nul(sql)?;
    match prepare_once(conn, sql, how) {
        Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::Unknown) => {
            if refresh_schema(conn).is_err() {
                return Err(e);
            }
            prepare_once(conn, sql, how)
        }
        r => r,
    }
}

/// Brings the connection's cached schema up to date with its database.
pub(crate) fn refresh_schema(conn: &Connection) -> rusqlite::Result<()> {
    let mut s = conn.prepare("SELECT 1 FROM sqlite_schema LIMIT 1")?;
    let mut rows = s.raw_query();
    rows.next()?;
    Ok(())
}

/// Sets the connection's last insert row id to 0, so that what a
/// statement reports as `last_row_id` is its own insert's (0 if it
/// inserted nothing), not one left by an earlier writer on the shared
/// writer connection.
pub(crate) fn forget_last_row_id(conn: &rusqlite::Connection) {
    // SAFETY: the handle belongs to a live connection that the caller
    // holds (the writer, behind its lock) for the duration of the call;
    // sqlite3_set_last_insert_rowid only stores an integer on it.
    unsafe { rusqlite::ffi::sqlite3_set_last_insert_rowid(conn.handle(), 0) }
}

/// Prepares, binds and runs one statement to completion on `c`, whose
/// watch the caller has armed. A result past `max_response_bytes` stops
/// (a write's effect is rolled back) with `ResponseTooLarge`; at most one
/// value is read past the cap.
pub(crate) fn run_statement(
    c: &Pooled,
    sql: &str,
    params: &[Value],
    how: Prepare,
    max_response_bytes: u64,
) -> Result<StatementOutput, QueryError> {
    let stmt = prepare(&c.conn.conn, sql, how).map_err(QueryError::sql)?;
    run_prepared(c, stmt, params, max_response_bytes)
}

/// [`run_statement`] for a statement already prepared on `c`'s connection.
pub(crate) fn run_prepared(
    c: &Pooled,
    mut stmt: Prepared<'_>,
    params: &[Value],
    max_response_bytes: u64,
) -> Result<StatementOutput, QueryError> {
    let conn = &c.conn.conn;
    let expected = stmt.parameter_count();
    if expected != params.len() {
        return Err(QueryError::ParameterCount {
            expected,
            given: params.len(),
        });
    }
    for (i, p) in params.iter().enumerate() {
        stmt.raw_bind_parameter(i + 1, p).map_err(QueryError::sql)?;
    }
    let columns: Arc<[String]> = stmt.column_names().map(String::from).collect();
    let readonly = stmt.readonly();
    stmt.reset_status(StatementStatus::FullscanStep);
    let before = conn.total_changes();
    let mut rows = Vec::new();
    let mut bytes = 0u64;
    {
        let mut rs = stmt.raw_query();
        loop {
            let over = match rs.next() {
                Ok(Some(row)) => {
                    let mut values = Vec::with_capacity(columns.len());
                    for i in 0..columns.len() {
                        let v = row.get_ref_unwrap(i);
                        bytes = bytes.saturating_add(value_bytes(v));
                        if bytes > max_response_bytes {
                            break;
                        }
                        values.push(Value::from(v));
                    }
                    if bytes > max_response_bytes {
                        true
                    } else {
                        rows.push(Row::new(Arc::clone(&columns), values));
                        false
                    }
                }
                Ok(None) => break,
                Err(e) => return Err(c.watch.explain(QueryError::sql(e))),
            };
            if over {
                // Resetting a write before it finishes would commit it:
                // interrupt it instead, so its next step fails and its
                // transaction rolls back.
                conn.get_interrupt_handle().interrupt();
                let _ = rs.next();
                return Err(QueryError::ResponseTooLarge {
                    limit_bytes: max_response_bytes,
                });
            }
        }
    }
    // rows_read approximates D1's count: rows stepped over by full scans
    // plus rows returned (SQLite keeps no per-row read counter).
    let rows_read =
        stmt.get_status(StatementStatus::FullscanStep).max(0) as u64 + rows.len() as u64;
    let changes = if readonly {
        0
    } else {
        conn.total_changes().saturating_sub(before)
    };
    Ok((columns, rows, Counts { rows_read, changes }))
}

pub(crate) fn tx_control_refused() -> QueryError {
    QueryError::NotSupported(crate::error::REFUSED_STATEMENT.into())
}

/// Whether an error may reflect database state (and so must wait at the
/// output gate like a result): everything but the errors about the engine
/// itself.
fn reveals_state(e: &QueryError) -> bool {
    !matches!(
        e,
        QueryError::NotConfirmed { .. }
            | QueryError::WriteNotAdmitted { .. }
            | QueryError::CaptureFailed(_)
            | QueryError::SequenceExhausted
            | QueryError::ReadOnlyReplica
            | QueryError::ReadOnlyAccess
            | QueryError::ReplicaBehind { .. }
            | QueryError::Busy { .. }
            | QueryError::Cancelled
            | QueryError::Stopping
            | QueryError::WriteAbandoned
    )
}

impl Database {
    fn pool_wait(&self) -> Duration {
        Duration::from_millis(self.inner.limits.pool_wait_ms)
    }

    /// The primary's writer for one write or batch: admitted by the output
    /// gate, waited for at most `pool_wait_ms`, and with any setting the
    /// previous writer's client changed reset (the sandbox).
    fn writer(&self) -> Result<(&PrimaryRole, MutexGuard<'_, Pooled>), QueryError> {
        let Some(p) = self.primary() else {
            return Err(QueryError::ReadOnlyReplica);
        };
        p.gate_admit()?;
        let Some(w) = p.writer.try_lock_for(self.pool_wait()) else {
            return Err(QueryError::Busy {
                resource: "the writer",
                waited_ms: self.inner.limits.pool_wait_ms,
            });
        };
        crate::sandbox::reset_if_dirty(&w.conn).map_err(QueryError::sql)?;
        Ok((p, w))
    }

    /// Holds an error until the state it may reflect is confirmed, as a
    /// result would be: a read's at the latest bookmark once in-flight
    /// commits settle, a failed write's at the latest bookmark. If the
    /// gate gives up, its error replaces the original.
    pub(crate) fn settle_error(&self, e: QueryError, read: bool) -> QueryError {
        let Some(p) = self.primary() else {
            return e;
        };
        if !reveals_state(&e) {
            return e;
        }
        if read {
            p.attachment.wait_commit_settled();
        }
        match p.gate_wait(self.latest_bookmark()) {
            Ok(()) => e,
            Err(g) => g,
        }
    }

    /// Whether `sql` is read-only, asked of an idle reader (returned too,
    /// to run the read) or, when every reader is busy, of the classifier.
    #[allow(clippy::type_complexity)]
    fn classify(
        &self,
        sql: &str,
    ) -> Result<(Option<Lease<'_>>, rusqlite::Result<bool>), QueryError> {
        if let Some(r) = self.inner.readers.try_take()? {
            let readonly = prepare(&r.conn.conn, sql, Prepare::Cached).map(|s| s.readonly());
            return Ok((Some(r), readonly));
        }
        let Some(c) = self.inner.classifier.try_lock_for(self.pool_wait()) else {
            return Err(QueryError::Busy {
                resource: "the classifier connection",
                waited_ms: self.inner.limits.pool_wait_ms,
            });
        };
        let readonly = prepare(&c.conn.conn, sql, Prepare::Cached).map(|s| s.readonly());
        Ok((None, readonly))
    }

    /// How many statements `sql` holds, asked of an idle reader or the
    /// classifier.
    fn count_statements(&self, sql: &str) -> Result<crate::split::Count, QueryError> {
        let max = self.inner.limits.max_sql_bytes as usize;
        if !sql.as_bytes().contains(&b';') {
            return Ok(crate::split::Count::One);
        }
        if let Some(r) = self.inner.readers.try_take()? {
            return Ok(crate::split::count(&r.conn.conn, sql, max));
        }
        let Some(c) = self.inner.classifier.try_lock_for(self.pool_wait()) else {
            return Err(QueryError::Busy {
                resource: "the classifier connection",
                waited_ms: self.inner.limits.pool_wait_ms,
            });
        };
        Ok(crate::split::count(&c.conn.conn, sql, max))
    }

    /// Runs the statements of `sql` (D1's `sql` field: one statement, or
    /// several joined by semicolons), one result each. One statement runs
    /// as [`Database::execute`] runs it. Several run as one atomic batch,
    /// each delimited by SQLite once the ones before it ran, `params`
    /// binding to the last ([`crate::split`]): on a primary on the writer;
    /// under read-only access, or on a replica, in one read transaction on
    /// a reader, where a statement that writes fails the whole text with
    /// `ReadOnlyAccess` (read-only access) or `ReadOnlyReplica` (a
    /// replica: the caller sends it to the primary) before it runs.
    pub(crate) fn execute_script(
        &self,
        sql: &str,
        params: &[Value],
        at_least: Option<Bookmark>,
        access: Access,
        cancel: Option<&CancelToken>,
    ) -> Result<Vec<Output>, QueryError> {
        let started = Instant::now();
        check_start(&self.inner.stopping, cancel)?;
        self.check_capture()?;
        use crate::split::Count;
        let mut count = self.count_statements(sql)?;
        if let (Role::Replica(r), Some(b)) = (&self.inner.role, at_least)
            && count != Count::One
            && r.visible() < b
        {
            // Several statements (or a first one this replica cannot
            // prepare yet) are split and read against the session's
            // schema, not an older one. One statement is not held back
            // here: `execute` forwards a write at once.
            r.wait_visible(b)?;
            count = self.count_statements(sql)?;
        }
        if count != Count::Several {
            return self
                .execute(sql, params, at_least, access, cancel)
                .map(|o| vec![o]);
        }
        let items = [(sql.to_string(), params.to_vec())];
        match (&self.inner.role, access) {
            (Role::Replica(_), Access::ReadWrite) => {
                self.read_only_batch(&items, started, cancel, || QueryError::ReadOnlyReplica)
            }
            _ => self.execute_batch(&items, access, cancel),
        }
    }

    /// Runs one statement: on a reader if SQLite says it is read-only,
    /// otherwise on the writer (a replica refuses it). `at_least` is the
    /// session's bookmark: the read must reflect at least that state.
    pub(crate) fn execute(
        &self,
        sql: &str,
        params: &[Value],
        at_least: Option<Bookmark>,
        access: Access,
        cancel: Option<&CancelToken>,
    ) -> Result<Output, QueryError> {
        let started = Instant::now();
        check_start(&self.inner.stopping, cancel)?;
        // A refused capture left a transaction in the local WAL that has no
        // bookmark and never will: serve nothing that could show it.
        self.check_capture()?;
        if self.primary().is_some() && crate::group_write::is_plain_dml(sql) {
            // A write by its first word: no need to ask SQLite (on a
            // reader) whether it is read-only before the writer runs it.
            return self.write(sql, params, access, started, cancel);
        }
        let (mut reader, mut readonly) = self.classify(sql)?;
        if let (Role::Replica(r), Some(b)) = (&self.inner.role, at_least)
            && r.visible() < b
        {
            if matches!(readonly, Ok(false)) {
                // A write goes to the primary anyway: no reason to wait for
                // this replica to catch up first.
                return Err(QueryError::ReadOnlyReplica);
            }
            // A read (or a statement naming what the session's bookmark
            // created but this replica has not applied yet): wait, then
            // classify again against the newer schema.
            drop(reader);
            r.wait_visible(b)?;
            (reader, readonly) = self.classify(sql)?;
        }
        let readonly = match readonly {
            Ok(r) => r,
            Err(e) => return Err(self.settle_error(QueryError::sql(e), true)),
        };
        if readonly {
            let reader = match reader {
                Some(r) => r,
                None => self.inner.readers.take(self.pool_wait())?,
            };
            return self.read(reader, sql, params, access, started, cancel);
        }
        drop(reader);
        self.write(sql, params, access, started, cancel)
    }

    fn read(
        &self,
        reader: Lease<'_>,
        sql: &str,
        params: &[Value],
        access: Access,
        started: Instant,
        cancel: Option<&CancelToken>,
    ) -> Result<Output, QueryError> {
        let limits = self.inner.limits;
        let r = {
            let _armed = reader.watch.arm(limits.query_timeout_ms, cancel);
            run_statement(
                &reader,
                sql,
                params,
                Prepare::Cached,
                limits.max_response_bytes,
            )
        };
        // A statement that opened a transaction must not leave the
        // pooled connection inside it.
        let left_open = !reader.conn.conn.is_autocommit();
        if left_open {
            let _ = reader.conn.engine_exec("ROLLBACK");
        }
        drop(reader);
        let (columns, rows, counts) = match r {
            Ok(_) if left_open => return Err(self.settle_error(tx_control_refused(), true)),
            Ok(o) => o,
            // SQLite calls a few statements read-only that may still write
            // (`PRAGMA optimize` deciding to run ANALYZE): they belong
            // where writes run.
            Err(QueryError::Sql {
                code: Some(code), ..
            }) if code & 0xff == rusqlite::ffi::SQLITE_READONLY => {
                return self.write(sql, params, access, started, cancel);
            }
            Err(e) => return Err(self.settle_error(e, true)),
        };
        let bookmark = self.read_bookmark()?;
        let mut meta = self.meta(started, bookmark);
        meta.rows_read = counts.rows_read;
        Ok(Output {
            columns,
            rows,
            meta,
        })
    }

    /// The bookmark a read's result reflects, once it may be released: on
    /// a primary, the latest once in-flight commits settle, held at the
    /// output gate until confirmed (no reader sees an unconfirmed
    /// transaction); on a replica, what it reported as visible.
    pub(crate) fn read_bookmark(&self) -> Result<Bookmark, QueryError> {
        match &self.inner.role {
            Role::Primary(p) => {
                p.attachment.wait_commit_settled();
                self.check_capture()?;
                let bookmark = self.latest_bookmark();
                p.gate_wait(bookmark)?;
                Ok(bookmark)
            }
            // Raised before a confirm publishes: at least what was seen.
            Role::Replica(r) => Ok(r.reported()),
        }
    }

    /// A batch on a reader, in one read transaction, whose connection
    /// cannot write: under read-only access (a statement SQLite calls
    /// read-only but that writes anyway, `PRAGMA optimize` running
    /// ANALYZE, fails there instead of committing on the writer), or a
    /// multi-statement text on a replica. A statement that writes fails
    /// the batch with `on_write`'s error before it runs.
    fn read_only_batch(
        &self,
        stmts: &[(String, Vec<Value>)],
        started: Instant,
        cancel: Option<&CancelToken>,
        on_write: fn() -> QueryError,
    ) -> Result<Vec<Output>, QueryError> {
        let limits = self.inner.limits;
        let reader = self.inner.readers.take(self.pool_wait())?;
        let armed = reader.watch.arm(limits.query_timeout_ms, cancel);
        reader.conn.engine_exec("BEGIN").map_err(QueryError::sql)?;
        reader.conn.set_in_batch(true);
        let mut outs = Vec::with_capacity(stmts.len());
        let mut failure = None;
        let mut cursor = Cursor::new(stmts, limits.max_sql_bytes);
        loop {
            let index = outs.len();
            let next = match cursor.next(&reader.conn.conn) {
                Ok(Some(n)) => n,
                Ok(None) => break,
                Err(e) => {
                    failure = Some(QueryError::Batch {
                        index,
                        source: Box::new(e),
                    });
                    break;
                }
            };
            let source = if !next.readonly {
                on_write()
            } else {
                match run_statement(
                    &reader,
                    next.sql,
                    next.params,
                    Prepare::Fresh,
                    limits.max_response_bytes,
                ) {
                    Ok(o) if !reader.conn.conn.is_autocommit() => {
                        outs.push(o);
                        continue;
                    }
                    Ok(_) => tx_control_refused(),
                    Err(QueryError::Sql {
                        code: Some(code), ..
                    }) if code & 0xff == rusqlite::ffi::SQLITE_READONLY => on_write(),
                    Err(e) => e,
                }
            };
            failure = Some(QueryError::Batch {
                index,
                source: Box::new(source),
            });
            break;
        }
        reader.conn.set_in_batch(false);
        // Nothing to keep: the transaction only read.
        if !reader.conn.conn.is_autocommit() {
            let _ = reader.conn.engine_exec("ROLLBACK");
        }
        drop(armed);
        drop(reader);
        if let Some(e) = failure {
            // A write met on a replica is not an error to wait for: it
            // goes to the primary.
            if matches!(&e, QueryError::Batch { source, .. } if matches!(**source, QueryError::ReadOnlyReplica))
            {
                return Err(QueryError::ReadOnlyReplica);
            }
            return Err(self.settle_error(e, true));
        }
        let bookmark = self.read_bookmark()?;
        Ok(outs
            .into_iter()
            .map(|(columns, rows, counts)| {
                let mut meta = self.meta(started, bookmark);
                meta.rows_read = counts.rows_read;
                Output {
                    columns,
                    rows,
                    meta,
                }
            })
            .collect())
    }

    /// Runs statements atomically in one write transaction: all or nothing.
    /// The query time limit bounds the whole batch.
    pub(crate) fn execute_batch(
        &self,
        stmts: &[(String, Vec<Value>)],
        access: Access,
        cancel: Option<&CancelToken>,
    ) -> Result<Vec<Output>, QueryError> {
        let started = Instant::now();
        check_start(&self.inner.stopping, cancel)?;
        self.check_capture()?;
        if access == Access::ReadOnly {
            return self.read_only_batch(stmts, started, cancel, || QueryError::ReadOnlyAccess);
        }
        let limits = self.inner.limits;
        let (p, w) = self.writer()?;
        let armed = w.watch.arm(limits.query_timeout_ms, cancel);
        forget_last_row_id(&w.conn.conn);
        if let Err(e) = w.conn.engine_exec_cached("BEGIN IMMEDIATE") {
            drop(armed);
            let e = self.explain(QueryError::sql(e));
            drop(w);
            return Err(self.settle_error(e, false));
        }
        w.conn.set_in_batch(true);
        let mut outs = Vec::with_capacity(stmts.len());
        let mut failure = None;
        let mut cursor = Cursor::new(stmts, limits.max_sql_bytes);
        loop {
            let index = outs.len();
            let ran = cursor.next(&w.conn.conn).and_then(|next| match next {
                None => Ok(None),
                Some(n) => run_statement(
                    &w,
                    n.sql,
                    n.params,
                    Prepare::Fresh,
                    limits.max_response_bytes,
                )
                .map(Some),
            });
            match ran {
                Ok(None) => break,
                Ok(Some(o)) if !w.conn.conn.is_autocommit() => outs.push(o),
                Ok(Some(_)) => {
                    failure = Some(QueryError::Batch {
                        index,
                        source: Box::new(tx_control_refused()),
                    });
                    break;
                }
                Err(e) => {
                    failure = Some(QueryError::Batch {
                        index,
                        source: Box::new(e),
                    });
                    break;
                }
            }
        }
        w.conn.set_in_batch(false);
        let committed = match failure {
            Some(e) => Err(e),
            None => w.conn.engine_exec_cached("COMMIT").map_err(QueryError::sql),
        };
        drop(armed);
        if let Err(e) = committed {
            if !w.conn.conn.is_autocommit() {
                let _ = w.conn.engine_exec("ROLLBACK");
            }
            // Explained while this request still holds the writer: the
            // capture's size refusal is this transaction's, not a later
            // writer's.
            let e = self.explain(e);
            drop(w);
            return Err(self.settle_error(e, false));
        }
        self.check_capture()?;
        let bookmark = self.latest_bookmark();
        let last_row_id = w.conn.conn.last_insert_rowid();
        p.maybe_checkpoint(&w.conn.conn);
        drop(w);
        p.gate_wait(bookmark)?;
        Ok(outs
            .into_iter()
            .map(|(columns, rows, counts)| {
                let mut meta = self.meta(started, bookmark);
                meta.rows_read = counts.rows_read;
                meta.rows_written = counts.changes;
                meta.changes = counts.changes;
                meta.last_row_id = last_row_id;
                Output {
                    columns,
                    rows,
                    meta,
                }
            })
            .collect())
    }

    /// Stops every running query and refuses new ones
    /// ([`QueryError::Stopping`]); for a process that is shutting down.
    /// Irreversible for this database.
    pub fn stop_queries(&self) {
        self.inner.stopping.store(true, Ordering::Release);
    }

    /// Reader connections lent out now, and open in all (they are opened
    /// on demand up to `Options::readers`).
    pub fn readers_in_use(&self) -> (usize, usize) {
        self.inner.readers.counts()
    }
}
