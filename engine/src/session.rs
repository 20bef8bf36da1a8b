//! The sessions API, shaped like D1's: a session carries the latest
//! bookmark it has seen, and every result says where it was served and at
//! which bookmark.

use crate::database::{Database, Output};
use crate::error::{QueryError, SessionError};
use crate::execution::CancelToken;
use crate::value::{Row, Value};
use parking_lot::Mutex;
use std::str::FromStr;
use walrelay_replicator::Bookmark;

/// Where a session's first query may be served (D1's `withSession`
/// argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Constraint {
    /// Any copy may serve the first query (`first-unconstrained`).
    FirstUnconstrained,
    /// The first query goes to the primary (`first-primary`).
    FirstPrimary,
    /// Continue from a bookmark: every query sees at least its state.
    Bookmark(Bookmark),
}

impl FromStr for Constraint {
    type Err = SessionError;
    fn from_str(s: &str) -> Result<Constraint, SessionError> {
        match s {
            "first-unconstrained" => Ok(Constraint::FirstUnconstrained),
            "first-primary" => Ok(Constraint::FirstPrimary),
            b => Ok(Constraint::Bookmark(b.parse()?)),
        }
    }
}

/// What a session's statements may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Access {
    /// Reads and writes.
    #[default]
    ReadWrite,
    /// Only statements SQLite calls read-only (`sqlite3_stmt_readonly`);
    /// any other is refused with [`QueryError::ReadOnlyAccess`] before it
    /// runs, and a batch holding one changes nothing.
    ReadOnly,
}

/// What D1 reports with every result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub served_by_primary: bool,
    pub served_by_region: String,
    /// The database position this result reflects (at least).
    pub bookmark: Bookmark,
    /// Rows stepped over by full scans plus rows returned: an approximation
    /// of D1's count, which SQLite does not keep exactly.
    pub rows_read: u64,
    /// Rows inserted, updated or deleted (SQLite's change count).
    pub rows_written: u64,
    pub changes: u64,
    pub last_row_id: i64,
    pub duration_us: u64,
}

/// Rows as objects (D1's `all()` / `run()`).
#[derive(Debug, Clone, PartialEq)]
pub struct QueryResult {
    pub results: Vec<Row>,
    pub meta: Meta,
}

/// Rows as arrays (D1's `raw()`).
#[derive(Debug, Clone, PartialEq)]
pub struct RawResult {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Value>>,
    pub meta: Meta,
}

/// A sequence of queries with sequential consistency: each sees every write
/// the session made or observed before it.
#[derive(Debug)]
pub struct Session {
    db: Database,
    constraint: Constraint,
    bookmark: Mutex<Option<Bookmark>>,
    cancel: Option<CancelToken>,
    access: Access,
}

impl Session {
    pub(crate) fn new(db: Database, constraint: Constraint, start: Option<Bookmark>) -> Session {
        Session {
            db,
            constraint,
            bookmark: Mutex::new(start),
            cancel: None,
            access: Access::ReadWrite,
        }
    }

    /// Stops this session's running and later queries once `token` is
    /// cancelled (they fail with `QueryError::Cancelled`).
    pub fn cancel_with(mut self, token: CancelToken) -> Session {
        self.cancel = Some(token);
        self
    }

    /// The same session with `access` (sessions start read-write).
    pub fn with_access(mut self, access: Access) -> Session {
        self.access = access;
        self
    }

    pub fn access(&self) -> Access {
        self.access
    }

    /// The latest bookmark this session has seen: the maximum of where it
    /// started and every response. `None` before the first query of an
    /// unconstrained session.
    pub fn bookmark(&self) -> Option<Bookmark> {
        *self.bookmark.lock()
    }

    pub fn constraint(&self) -> Constraint {
        self.constraint
    }

    /// Every page of the session's database, as
    /// [`Database::page_images`] reads them.
    pub fn page_images(&self) -> Result<Vec<Vec<u8>>, QueryError> {
        self.db.page_images()
    }

    /// A statement to run in this session. Nothing touches the database
    /// until it runs.
    pub fn prepare(&self, sql: impl Into<String>) -> Statement<'_> {
        Statement {
            session: self,
            sql: sql.into(),
            params: Vec::new(),
        }
    }

    /// Runs statements as one atomic transaction: every statement's effect
    /// or none. Statements from any session may be passed; this session's
    /// bookmark advances.
    pub fn batch<'a>(
        &self,
        statements: impl IntoIterator<Item = Statement<'a>>,
    ) -> Result<Vec<QueryResult>, QueryError> {
        let stmts: Vec<(String, Vec<Value>)> =
            statements.into_iter().map(|s| (s.sql, s.params)).collect();
        let outs = self
            .db
            .execute_batch(&stmts, self.access, self.cancel.as_ref())?;
        if let Some(o) = outs.last() {
            self.observe(o.meta.bookmark);
        }
        Ok(outs
            .into_iter()
            .map(|o| QueryResult {
                results: o.rows,
                meta: o.meta,
            })
            .collect())
    }

    /// Runs every statement of `sql` (one, or several joined by
    /// semicolons, as D1's `sql` field allows), one result each, with the
    /// column names even when no row came back. Several statements are
    /// one atomic transaction, their parameters binding to the last (D1's
    /// rule; an earlier statement taking parameters is
    /// [`QueryError::ParametersNotLast`]).
    pub fn exec(
        &self,
        sql: &str,
        params: impl IntoIterator<Item = Value>,
    ) -> Result<Vec<RawResult>, QueryError> {
        let params: Vec<Value> = params.into_iter().collect();
        let at_least = *self.bookmark.lock();
        let outs =
            self.db
                .execute_script(sql, &params, at_least, self.access, self.cancel.as_ref())?;
        Ok(self.raw_results(outs))
    }

    /// [`Session::exec`] of one plain DML write, waited for by a task
    /// rather than a thread ([`crate::group_write_async`]); `None`
    /// declines, having changed nothing (run it with `exec`).
    pub(crate) fn exec_without_thread(
        self: std::sync::Arc<Self>,
        sql: &str,
        params: &[Value],
    ) -> Option<impl std::future::Future<Output = Result<Vec<RawResult>, QueryError>> + Send + use<>>
    {
        let write = self
            .db
            .write_without_thread(sql, params, self.access, self.cancel.as_ref())?;
        Some(async move {
            let out = write.await?;
            Ok(self.raw_results(vec![out]))
        })
    }

    /// [`Session::exec`] of one short read, run on the calling thread
    /// ([`crate::read_on_worker`]), its result waited for at the output
    /// gate by the returned future; `None` declines, having changed
    /// nothing (run it with `exec`).
    pub(crate) fn exec_on_worker(
        self: std::sync::Arc<Self>,
        sql: &str,
        params: &[Value],
    ) -> Option<impl std::future::Future<Output = Result<Vec<RawResult>, QueryError>> + Send + use<>>
    {
        let at_least = *self.bookmark.lock();
        let held = self
            .db
            .read_without_thread(sql, params, at_least, self.cancel.as_ref())?;
        Some(async move {
            let out = held.release(self.db.clone()).await?;
            Ok(self.raw_results(vec![out]))
        })
    }

    /// [`Session::batch`] with rows as arrays and the column names. Each
    /// statement's text may hold several statements (as in
    /// [`Session::exec`]): there is one result per statement run.
    pub fn batch_raw<'a>(
        &self,
        statements: impl IntoIterator<Item = Statement<'a>>,
    ) -> Result<Vec<RawResult>, QueryError> {
        let stmts: Vec<(String, Vec<Value>)> =
            statements.into_iter().map(|s| (s.sql, s.params)).collect();
        let outs = self
            .db
            .execute_batch(&stmts, self.access, self.cancel.as_ref())?;
        Ok(self.raw_results(outs))
    }

    fn raw_results(&self, outs: Vec<Output>) -> Vec<RawResult> {
        if let Some(b) = outs.iter().map(|o| o.meta.bookmark).max() {
            self.observe(b);
        }
        outs.into_iter()
            .map(|o| RawResult {
                columns: o.columns.to_vec(),
                rows: o.rows.into_iter().map(Row::into_values).collect(),
                meta: o.meta,
            })
            .collect()
    }

    fn observe(&self, b: Bookmark) {
        let mut cur = self.bookmark.lock();
        if cur.is_none_or(|c| b > c) {
            *cur = Some(b);
        }
    }

    fn execute(&self, sql: &str, params: &[Value]) -> Result<Output, QueryError> {
        let at_least = *self.bookmark.lock();
        let out = self
            .db
            .execute(sql, params, at_least, self.access, self.cancel.as_ref())?;
        self.observe(out.meta.bookmark);
        Ok(out)
    }
}

/// A statement with its bound parameters (D1's prepared statement).
#[derive(Debug, Clone)]
pub struct Statement<'s> {
    session: &'s Session,
    sql: String,
    params: Vec<Value>,
}

impl<'s> Statement<'s> {
    /// Binds positional parameters (`?`, `?NNN`, `:name` by position),
    /// replacing any bound before.
    pub fn bind<I, V>(mut self, params: I) -> Statement<'s>
    where
        I: IntoIterator<Item = V>,
        V: Into<Value>,
    {
        self.params = params.into_iter().map(Into::into).collect();
        self
    }

    pub fn sql(&self) -> &str {
        &self.sql
    }

    /// Runs the statement; rows as objects.
    pub fn all(&self) -> Result<QueryResult, QueryError> {
        let o = self.session.execute(&self.sql, &self.params)?;
        Ok(QueryResult {
            results: o.rows,
            meta: o.meta,
        })
    }

    /// Runs the statement; as `all()` (D1 returns the same shape).
    pub fn run(&self) -> Result<QueryResult, QueryError> {
        self.all()
    }

    /// Runs the statement and returns its first row, if any.
    pub fn first(&self) -> Result<Option<Row>, QueryError> {
        Ok(self.all()?.results.into_iter().next())
    }

    /// Runs the statement; rows as arrays, with the column names.
    pub fn raw(&self) -> Result<RawResult, QueryError> {
        let o = self.session.execute(&self.sql, &self.params)?;
        Ok(RawResult {
            columns: o.columns.to_vec(),
            rows: o.rows.into_iter().map(Row::into_values).collect(),
            meta: o.meta,
        })
    }
}
