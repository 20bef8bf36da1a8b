//! A database as SQL text (D1's export, `wrangler d1 export`), read from
//! one consistent snapshot, and the import that runs such a text.
//!
//! # Format
//!
//! ```text
//! PRAGMA defer_foreign_keys=TRUE;
//! CREATE TABLE "t"(id INTEGER PRIMARY KEY, name TEXT, ...);   each table as created,
//! INSERT INTO "t"("id","name",...) VALUES(1,'it''s',X'00ff',2.5e0,NULL);   then its rows
//! ...
//! DELETE FROM sqlite_sequence;                                 AUTOINCREMENT counters, if any
//! INSERT INTO "sqlite_sequence" VALUES('t',42);
//! CREATE INDEX ...; CREATE VIEW ...; CREATE TRIGGER ...;       the rest, in creation order
//! ```
//!
//! - Tables come in creation order (`sqlite_schema` rowid), each followed
//!   by its rows; indexes, views and triggers follow every row, in creation
//!   order, so a trigger does not fire during the import and an index is
//!   built once.
//! - Skipped: SQLite's own tables (`sqlite_%`, except the AUTOINCREMENT
//!   counters) and Cloudflare's reserved `_cf_%` (walrelay keeps no tables
//!   of its own in a client's database). A virtual table refuses the
//!   export ([`DumpError::VirtualTable`]), as D1's does.
//! - Values: NULL; integers in decimal; reals in Rust's shortest
//!   round-trip form with an exponent (`2.5e0`, `1e-300`), infinities as
//!   `1e999` / `-1e999` (SQLite reads both back as infinite; it stores no
//!   NaN, binding one stores NULL); text quoted with `'` doubled; blobs
//!   as `X'hex'`. Generated columns are left out (SQLite computes them).
//! - The text is built in memory up to `max_bytes` (plus one row): past
//!   it the export stops with [`DumpError::TooLarge`].
//!
//! An import runs a text as one transaction on the writer (all or nothing),
//! each statement delimited by SQLite as its turn comes ([`crate::split`]),
//! bounded by the database's limits: every statement by `max_sql_bytes`,
//! the transaction by `max_transaction_bytes`. Transaction control in the
//! text (`BEGIN`, `COMMIT`) is refused, as D1 refuses it.

use crate::database::Database;
use crate::error::QueryError;
use crate::execution::CancelToken;
use crate::session::Meta;
use crate::value::Value;
use rusqlite::types::ValueRef;
use std::fmt::Write as _;
use std::time::Instant;
use walrelay_replicator::Bookmark;

/// What to export (D1's `dump_options`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DumpOptions {
    /// Only the definitions, no rows.
    pub no_data: bool,
    /// Only the rows, no definitions.
    pub no_schema: bool,
    /// Only these tables (empty: all).
    pub tables: Vec<String>,
}

/// An export.
#[derive(Debug, Clone)]
pub struct Dump {
    pub sql: String,
    /// The state the dump reflects is at least this bookmark's.
    pub bookmark: Bookmark,
    pub tables: usize,
    pub rows: u64,
}

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error("the export is larger than the limit of {limit_bytes} bytes")]
    TooLarge { limit_bytes: usize },
    #[error("table {name:?} is a virtual table: databases with virtual tables cannot be exported")]
    VirtualTable { name: String },
    #[error("no table {name:?} to export")]
    UnknownTable { name: String },
    #[error(transparent)]
    Query(#[from] QueryError),
}

/// What an import did.
#[derive(Debug, Clone)]
pub struct Imported {
    /// Statements run.
    pub num_queries: usize,
    /// The import's commit (restore to it to undo later changes).
    pub final_bookmark: Bookmark,
    /// Rows changed, summed over its statements; timings.
    pub meta: Meta,
}

/// Whether a table is not the client's to export.
fn internal(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.starts_with("sqlite_") || n.starts_with("_cf_")
}

/// `name` as a quoted identifier.
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A value as an SQL literal that reads back as the same value.
pub fn literal(out: &mut String, v: ValueRef<'_>) {
    match v {
        ValueRef::Null => out.push_str("NULL"),
        ValueRef::Integer(i) => {
            let _ = write!(out, "{i}");
        }
        ValueRef::Real(r) if r.is_nan() => out.push_str("NULL"),
        ValueRef::Real(r) if r.is_infinite() => {
            out.push_str(if r > 0.0 { "1e999" } else { "-1e999" })
        }
        ValueRef::Real(r) => {
            let _ = write!(out, "{r:e}");
        }
        ValueRef::Text(t) => {
            out.push('\'');
            out.push_str(&String::from_utf8_lossy(t).replace('\'', "''"));
            out.push('\'');
        }
        ValueRef::Blob(b) => {
            out.reserve(b.len() * 2 + 3);
            out.push_str("X'");
            for byte in b {
                let _ = write!(out, "{byte:02x}");
            }
            out.push('\'');
        }
    }
}

struct Builder {
    out: String,
    limit: usize,
}

impl Builder {
    fn check(&self) -> Result<(), DumpError> {
        if self.out.len() > self.limit {
            return Err(DumpError::TooLarge {
                limit_bytes: self.limit,
            });
        }
        Ok(())
    }
}

fn sql_err(e: rusqlite::Error) -> DumpError {
    DumpError::Query(QueryError::sql(e))
}

/// Writes the dump of the snapshot `conn` reads (inside a transaction).
fn write_dump(
    conn: &rusqlite::Connection,
    options: &DumpOptions,
    b: &mut Builder,
) -> Result<(usize, u64), DumpError> {
    let mut tables: Vec<(String, String)> = Vec::new();
    {
        let mut s = conn
            .prepare("SELECT name, sql FROM sqlite_schema WHERE type = 'table' ORDER BY rowid")
            .map_err(sql_err)?;
        let mut rows = s.query([]).map_err(sql_err)?;
        while let Some(row) = rows.next().map_err(sql_err)? {
            let name: String = row.get(0).map_err(sql_err)?;
            let sql: Option<String> = row.get(1).map_err(sql_err)?;
            if internal(&name) {
                continue;
            }
            let sql = sql.unwrap_or_default();
            if sql
                .trim_start()
                .get(..20)
                .is_some_and(|p| p.eq_ignore_ascii_case("CREATE VIRTUAL TABLE"))
            {
                return Err(DumpError::VirtualTable { name });
            }
            tables.push((name, sql));
        }
    }
    for wanted in &options.tables {
        if !tables.iter().any(|(n, _)| n == wanted) {
            return Err(DumpError::UnknownTable {
                name: wanted.clone(),
            });
        }
    }
    let chosen = |n: &str| options.tables.is_empty() || options.tables.iter().any(|t| t == n);
    b.out.push_str("PRAGMA defer_foreign_keys=TRUE;\n");
    let mut rows_out = 0u64;
    let mut count = 0usize;
    for (name, sql) in tables.iter().filter(|(n, _)| chosen(n)) {
        count += 1;
        if !options.no_schema {
            b.out.push_str(sql);
            b.out.push_str(";\n");
        }
        if options.no_data {
            continue;
        }
        let columns: Vec<String> = {
            let mut s = conn
                .prepare("SELECT name FROM pragma_table_xinfo(?1) WHERE hidden = 0 ORDER BY cid")
                .map_err(sql_err)?;
            s.query_map([name], |r| r.get::<_, String>(0))
                .map_err(sql_err)?
                .collect::<Result<_, _>>()
                .map_err(sql_err)?
        };
        let list = columns
            .iter()
            .map(|c| ident(c))
            .collect::<Vec<_>>()
            .join(",");
        let insert = format!("INSERT INTO {}({list}) VALUES(", ident(name));
        let mut s = conn
            .prepare(&format!("SELECT {list} FROM {}", ident(name)))
            .map_err(sql_err)?;
        let mut rows = s.query([]).map_err(sql_err)?;
        while let Some(row) = rows.next().map_err(sql_err)? {
            b.out.push_str(&insert);
            for i in 0..columns.len() {
                if i > 0 {
                    b.out.push(',');
                }
                literal(&mut b.out, row.get_ref(i).map_err(sql_err)?);
            }
            b.out.push_str(");\n");
            rows_out += 1;
            b.check()?;
        }
        b.check()?;
    }
    let has_sequence: bool = conn
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'sqlite_sequence'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map_err(sql_err)?
        > 0;
    if has_sequence && !options.no_data {
        let mut s = conn
            .prepare("SELECT name, seq FROM sqlite_sequence")
            .map_err(sql_err)?;
        let seqs: Vec<(String, i64)> = s
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(sql_err)?
            .collect::<Result<_, _>>()
            .map_err(sql_err)?;
        let seqs: Vec<_> = seqs.into_iter().filter(|(n, _)| chosen(n)).collect();
        if !seqs.is_empty() {
            b.out.push_str("DELETE FROM sqlite_sequence;\n");
            for (n, seq) in seqs {
                b.out.push_str("INSERT INTO \"sqlite_sequence\" VALUES(");
                literal(&mut b.out, ValueRef::Text(n.as_bytes()));
                let _ = writeln!(b.out, ",{seq});");
            }
        }
    }
    if !options.no_schema {
        let mut s = conn
            .prepare(
                "SELECT tbl_name, sql FROM sqlite_schema \
                 WHERE type IN ('index', 'trigger', 'view') AND sql IS NOT NULL ORDER BY rowid",
            )
            .map_err(sql_err)?;
        let mut rows = s.query([]).map_err(sql_err)?;
        while let Some(row) = rows.next().map_err(sql_err)? {
            let table: String = row.get(0).map_err(sql_err)?;
            let sql: String = row.get(1).map_err(sql_err)?;
            if internal(&table) || !chosen(&table) {
                continue;
            }
            b.out.push_str(&sql);
            b.out.push_str(";\n");
        }
        b.check()?;
    }
    Ok((count, rows_out))
}

impl Database {
    /// Exports the database as SQL text (the module's format), read in
    /// one read transaction on a reader, bounded by the query time limit
    /// and by `max_bytes`.
    pub fn dump(
        &self,
        options: &DumpOptions,
        max_bytes: usize,
        cancel: Option<&CancelToken>,
    ) -> Result<Dump, DumpError> {
        crate::execution::check_start(&self.inner.stopping, cancel)?;
        self.check_capture()?;
        let limits = self.inner.limits;
        let reader = self
            .inner
            .readers
            .take(std::time::Duration::from_millis(limits.pool_wait_ms))?;
        let written = {
            let _armed = reader.watch.arm(limits.query_timeout_ms, cancel);
            reader.conn.engine_exec("BEGIN").map_err(sql_err)?;
            let mut b = Builder {
                out: String::new(),
                limit: max_bytes,
            };
            let r = write_dump(&reader.conn.conn, options, &mut b);
            let _ = reader.conn.engine_exec("ROLLBACK");
            r.map(|counts| (b.out, counts)).map_err(|e| match e {
                DumpError::Query(q) => DumpError::Query(reader.watch.explain(q)),
                e => e,
            })
        };
        drop(reader);
        let (sql, (tables, rows)) = written?;
        let bookmark = self.read_bookmark()?;
        Ok(Dump {
            sql,
            bookmark,
            tables,
            rows,
        })
    }

    /// Runs `sql` (a dump, or any statements) as one transaction on the
    /// writer: all or nothing.
    pub fn import(&self, sql: &str, cancel: Option<&CancelToken>) -> Result<Imported, QueryError> {
        let started = Instant::now();
        let items = [(sql.to_string(), Vec::<Value>::new())];
        let outs = self.execute_batch(&items, crate::session::Access::ReadWrite, cancel)?;
        let final_bookmark = outs
            .last()
            .map_or_else(|| self.latest_bookmark(), |o| o.meta.bookmark);
        let mut meta = self.meta(started, final_bookmark);
        for o in &outs {
            meta.rows_read += o.meta.rows_read;
            meta.rows_written += o.meta.rows_written;
            meta.changes += o.meta.changes;
            meta.last_row_id = o.meta.last_row_id;
        }
        meta.duration_us = started.elapsed().as_micros() as u64;
        Ok(Imported {
            num_queries: outs.len(),
            final_bookmark,
            meta,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lit(v: ValueRef<'_>) -> String {
        let mut s = String::new();
        literal(&mut s, v);
        s
    }

    #[test]
    fn literals_quote_text_hex_blobs_and_keep_reals_exact() {
        assert_eq!(lit(ValueRef::Text(b"it's")), "'it''s'");
        assert_eq!(lit(ValueRef::Blob(&[0, 255, 16])), "X'00ff10'");
        assert_eq!(lit(ValueRef::Real(2.5)), "2.5e0");
        assert_eq!(lit(ValueRef::Real(f64::INFINITY)), "1e999");
        assert_eq!(lit(ValueRef::Real(f64::NEG_INFINITY)), "-1e999");
        assert_eq!(lit(ValueRef::Real(f64::NAN)), "NULL");
        assert_eq!(lit(ValueRef::Integer(i64::MIN)), "-9223372036854775808");
        assert!(internal("sqlite_sequence") && internal("_cf_KV") && !internal("cf_x"));
        assert_eq!(ident("a\"b"), "\"a\"\"b\"");
    }
}
