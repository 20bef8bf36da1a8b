//! Splitting SQL text into statements the way SQLite's parser does, one
//! statement at a time, against the connection that will run them.
//!
//! A text such as `CREATE TABLE t(x); INSERT INTO t VALUES (1); SELECT *
//! FROM t` cannot be prepared whole: the INSERT names a table that exists
//! only once the CREATE has run. So each statement is delimited
//! (`sqlite3_prepare_v3` and its tail pointer) only when its turn comes,
//! after the ones before it ran, on the same connection inside the same
//! transaction. Nothing here parses SQL by hand: whitespace, comments,
//! empty statements (`;;`), semicolons inside strings, identifiers,
//! comments and trigger bodies are all SQLite's business.
//!
//! # Size bound
//!
//! SQLite is given at most `max_sql_bytes` (D1's 100 KB per statement) of
//! the remaining text at a time (the *window*). When the window cuts the
//! text short and the statement (or an empty one, such as a long comment)
//! runs to the window's end, it may be truncated, so it is refused as too
//! long instead of run: a statement only ends early at a `;` the tokenizer
//! saw, which a cut cannot move.
//!
//! # Parameters
//!
//! A text's parameters bind to its **last** statement, as D1 does for a
//! prepared statement holding several queries. An earlier statement that
//! takes parameters is refused ([`QueryError::ParametersNotLast`]).

use crate::error::QueryError;
use crate::value::Value;
use rusqlite::{Connection, ffi};
use std::os::raw::c_int;

/// One statement of a text, as SQLite delimits it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Head {
    /// Byte range of the statement in the text (a `;` ending it included).
    pub(crate) start: usize,
    pub(crate) end: usize,
    /// `sqlite3_bind_parameter_count`.
    pub(crate) params: usize,
    /// `sqlite3_stmt_readonly`.
    pub(crate) readonly: bool,
}

/// The result of one `sqlite3_prepare_v3` over a window.
enum Prepared {
    /// A statement ending `consumed` bytes into the window.
    Statement {
        consumed: usize,
        params: usize,
        readonly: bool,
    },
    /// Only whitespace, comments or an empty statement, `consumed` bytes.
    Empty { consumed: usize },
}

fn prepare_window(conn: &Connection, window: &[u8]) -> rusqlite::Result<Prepared> {
    let len = c_int::try_from(window.len()).unwrap_or(c_int::MAX);
    let mut stmt: *mut ffi::sqlite3_stmt = std::ptr::null_mut();
    let mut tail: *const std::os::raw::c_char = std::ptr::null();
    // SAFETY: the handle is the open connection's, used on this thread
    // only while `conn` is borrowed; `window` is valid for `len` bytes
    // (SQLite reads no further and needs no terminator when given a
    // length); `stmt` and `tail` are out-pointers SQLite writes.
    let rc = unsafe {
        ffi::sqlite3_prepare_v3(
            conn.handle(),
            window.as_ptr().cast(),
            len,
            0,
            &mut stmt,
            &mut tail,
        )
    };
    if rc != ffi::SQLITE_OK {
        // SAFETY: as above; `sqlite3_errmsg` returns a string owned by the
        // connection, copied out at once; `stmt` is null on error.
        let message = unsafe {
            let m = ffi::sqlite3_errmsg(conn.handle());
            (!m.is_null()).then(|| std::ffi::CStr::from_ptr(m).to_string_lossy().into_owned())
        };
        return Err(rusqlite::Error::SqliteFailure(ffi::Error::new(rc), message));
    }
    let consumed = if tail.is_null() {
        window.len()
    } else {
        // `tail` points into `window` (SQLite's contract for pzTail).
        (tail as usize)
            .saturating_sub(window.as_ptr() as usize)
            .min(window.len())
    };
    if stmt.is_null() {
        return Ok(Prepared::Empty { consumed });
    }
    // SAFETY: `stmt` is the statement just prepared, finalized once here
    // and never used after.
    let (params, readonly) = unsafe {
        let p = ffi::sqlite3_bind_parameter_count(stmt);
        let r = ffi::sqlite3_stmt_readonly(stmt) != 0;
        ffi::sqlite3_finalize(stmt);
        (usize::try_from(p).unwrap_or(0), r)
    };
    Ok(Prepared::Statement {
        consumed,
        params,
        readonly,
    })
}

/// SQLite reads SQL text only up to a NUL character, whatever length it
/// is given: text after one would be dropped without a word (`SELECT 1\0;
/// DELETE FROM t` would run the SELECT and report success). So a text
/// holding one is refused, as a SQL error naming where: once per text,
/// where it starts to run ([`Cursor`] for several statements,
/// `statement::prepare` for one), not per statement split from it.
pub(crate) fn refuse_nul(sql: &str) -> rusqlite::Result<()> {
    match sql.bytes().position(|b| b == 0) {
        None => Ok(()),
        Some(at) => Err(rusqlite::Error::SqliteFailure(
            ffi::Error::new(ffi::SQLITE_ERROR),
            Some(format!(
                "the SQL text holds a NUL character (at byte {at}); SQLite would read no further"
            )),
        )),
    }
}

fn too_long(max_sql_bytes: usize) -> QueryError {
    QueryError::SqlTooLong {
        message: format!("statement too long: longer than {max_sql_bytes} bytes"),
    }
}

/// The first statement of `sql[from..]` (empty statements skipped), or
/// None when only whitespace, comments and `;` remain. An error is the
/// statement's own (it fails to prepare against the connection's schema
/// now) or a statement longer than `max_sql_bytes`.
pub(crate) fn next_statement(
    conn: &Connection,
    sql: &str,
    from: usize,
    max_sql_bytes: usize,
) -> Result<Option<Head>, QueryError> {
    let bytes = sql.as_bytes();
    let max = max_sql_bytes.max(1);
    let mut pos = from;
    while pos < bytes.len() {
        let end = bytes.len().min(pos.saturating_add(max));
        let truncated = end < bytes.len();
        let window = &bytes[pos..end];
        let prepared = match prepare_window(conn, window) {
            Ok(p) => p,
            // The connection's cached schema may be stale (see
            // `statement::prepare`): check it and try once more.
            Err(_) => {
                crate::statement::refresh_schema(conn).map_err(QueryError::sql)?;
                prepare_window(conn, window).map_err(QueryError::sql)?
            }
        };
        match prepared {
            Prepared::Statement {
                consumed,
                params,
                readonly,
            } => {
                if truncated && consumed >= window.len() {
                    return Err(too_long(max));
                }
                return Ok(Some(Head {
                    start: pos,
                    end: pos + consumed,
                    params,
                    readonly,
                }));
            }
            Prepared::Empty { consumed } => {
                if consumed == 0 || (truncated && consumed >= window.len()) {
                    // Nothing consumed (cannot happen for a non-empty
                    // window) or a comment past the window.
                    if truncated {
                        return Err(too_long(max));
                    }
                    return Ok(None);
                }
                pos += consumed;
            }
        }
    }
    Ok(None)
}

/// Whether another statement follows `from` (whether or not it would
/// prepare now: one naming what an earlier statement creates does not).
pub(crate) fn statement_follows(
    conn: &Connection,
    sql: &str,
    from: usize,
    max_sql_bytes: usize,
) -> bool {
    !matches!(next_statement(conn, sql, from, max_sql_bytes), Ok(None))
}

/// How many statements a text holds, as far as can be told now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Count {
    /// None or one.
    One,
    /// More than one.
    Several,
    /// The first statement does not prepare against the connection's
    /// schema (it may name what a newer schema has), so where it ends is
    /// not known.
    Unknown,
}

/// How many statements `sql` holds. Cheap when it has no `;` at all (the
/// common case): a statement can only end at one.
pub(crate) fn count(conn: &Connection, sql: &str, max_sql_bytes: usize) -> Count {
    if !sql.as_bytes().contains(&b';') {
        return Count::One;
    }
    match next_statement(conn, sql, 0, max_sql_bytes) {
        Ok(Some(h)) if statement_follows(conn, sql, h.end, max_sql_bytes) => Count::Several,
        Ok(_) => Count::One,
        Err(_) => Count::Unknown,
    }
}

/// One statement to run, with the parameters it binds.
pub(crate) struct Next<'a> {
    pub(crate) sql: &'a str,
    pub(crate) params: &'a [Value],
    pub(crate) readonly: bool,
}

/// The statements of a batch, delimited one at a time: every item's text
/// is split by SQLite, its parameters going to its last statement.
pub(crate) struct Cursor<'a> {
    items: &'a [(String, Vec<Value>)],
    item: usize,
    pos: usize,
    max_sql_bytes: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(items: &'a [(String, Vec<Value>)], max_sql_bytes: u32) -> Cursor<'a> {
        Cursor {
            items,
            item: 0,
            pos: 0,
            max_sql_bytes: max_sql_bytes as usize,
        }
    }

    /// The next statement, delimited against `conn` as it is now (the
    /// statements before it have run). An item with no statement at all
    /// is passed on whole, for the run to report as empty.
    pub(crate) fn next(&mut self, conn: &Connection) -> Result<Option<Next<'a>>, QueryError> {
        loop {
            let Some((sql, params)) = self.items.get(self.item) else {
                return Ok(None);
            };
            let first = self.pos == 0;
            let checked = if first {
                refuse_nul(sql).map_err(QueryError::sql)
            } else {
                Ok(())
            };
            let head = match checked
                .and_then(|()| next_statement(conn, sql, self.pos, self.max_sql_bytes))
            {
                Ok(h) => h,
                Err(e) => {
                    // Stop here: this statement is the batch's failure.
                    self.item = self.items.len();
                    return Err(e);
                }
            };
            let Some(h) = head else {
                self.item += 1;
                self.pos = 0;
                if first {
                    return Ok(Some(Next {
                        sql,
                        params,
                        readonly: true,
                    }));
                }
                continue;
            };
            self.pos = h.end;
            let last =
                params.is_empty() || !statement_follows(conn, sql, h.end, self.max_sql_bytes);
            if !last && h.params > 0 {
                self.item = self.items.len();
                return Err(QueryError::ParametersNotLast);
            }
            let text = sql.get(h.start..h.end).unwrap_or(sql);
            return Ok(Some(Next {
                sql: text,
                params: if last { params } else { &[] },
                readonly: h.readonly,
            }));
        }
    }
}
