//! The SQL sandbox: what a client's SQL may do to a connection, and the
//! limits SQLite itself enforces. D1 is the model: a client reaches its
//! own database and nothing else of the host or the engine.
//!
//! # Contract
//!
//! - [`install`] prepares every connection (writer, readers, replica
//!   readers): SQLite's defensive mode, no extension loading, untrusted
//!   schemas, no ATTACH-created or ATTACH-written files and no attached
//!   database at all on a reader (one, VACUUM's, on the writer), the limits from
//!   [`Limits`] (`sqlite3_limit`, and `max_page_count` on the writer), the
//!   engine's defaults for every setting a client may change, and the
//!   authorizer below.
//! - The authorizer refuses, at prepare time (or when VACUUM prepares its
//!   own statements): ATTACH and DETACH however the filename arrives
//!   (the one exception is VACUUM's own nameless temporary database, so
//!   plain VACUUM works and VACUUM INTO a file does not); every PRAGMA
//!   outside D1's documented list, in get and set form; raw page access
//!   (`sqlite_dbpage`, `dbstat`); `load_extension()` and
//!   `fts3_tokenizer()`; temporary schema objects (they would outlive the
//!   request on a pooled connection); and transaction control inside a
//!   batch. A refusal is typed ([`Refusal`]) and reaches the caller as
//!   `QueryError::NotAuthorized`.
//! - A statement the engine runs itself is marked with [`ENGINE`] and
//!   passes unchecked. Engine statements are never put in the statement
//!   cache, where a client's identical text could reuse them unchecked.
//! - A client may change the per-connection settings in [`SETTERS`] for
//!   its own request. The authorizer marks the connection [`DIRTY`] when
//!   it allows one; [`reset_if_dirty`] restores the engine's defaults (and
//!   drops the connection's statement cache, so a cached setter is
//!   authorized, and so marked, again) before the connection serves
//!   anyone else. A clean connection costs one atomic load.

use crate::conn_handle::Handle;
use crate::database::{Conn, Database};
use crate::error::QueryError;
use crate::limits::Limits;
use rusqlite::config::DbConfig;
use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::limits::Limit;
use rusqlite::{Connection, ffi};
use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

/// Set while the engine runs its own statements (BEGIN/COMMIT/ROLLBACK,
/// resets, page reads): the authorizer allows everything.
pub(crate) const ENGINE: u8 = 1;
/// Set while a batch's statements run: transaction control is refused.
pub(crate) const IN_BATCH: u8 = 2;
/// Set when a client changed a per-connection setting.
pub(crate) const DIRTY: u8 = 4;

/// Why the sandbox refused a statement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "ATTACH, DETACH and VACUUM INTO are not allowed: a query reaches only its own database"
    )]
    Attach,
    #[error("PRAGMA {name} is not allowed{}", if *.set { " to be set" } else { "" })]
    Pragma { name: String, set: bool },
    #[error("raw page access ({table}) is not allowed")]
    RawPages { table: String },
    #[error("the SQL function {name}() is not allowed")]
    Function { name: String },
    #[error(
        "temporary tables, views, indexes and triggers are not allowed: they would outlive the request"
    )]
    TemporaryObject,
    #[error("transaction control (BEGIN, COMMIT, ROLLBACK) inside a batch is not allowed")]
    TransactionControl,
    #[error("the statement was refused by the SQL sandbox (authorizer action {code})")]
    Other { code: i32 },
}

/// D1's introspection and maintenance pragmas: they read the schema or
/// check the database, with an optional table, index or limit argument.
const INTROSPECTION: &[&str] = &[
    "table_list",
    "table_info",
    "table_xinfo",
    "index_list",
    "index_info",
    "index_xinfo",
    "foreign_key_list",
    "foreign_key_check",
    "quick_check",
    "integrity_check",
    "optimize",
];

/// The per-connection settings D1 lets a query change, each with the
/// engine's default that [`reset_if_dirty`] restores. `foreign_keys` is on,
/// as in D1 (and SQLite as walrelay builds it).
pub(crate) const SETTERS: &[(&str, &str)] = &[
    ("foreign_keys", "ON"),
    ("defer_foreign_keys", "OFF"),
    ("recursive_triggers", "OFF"),
    ("reverse_unordered_selects", "OFF"),
    ("legacy_alter_table", "OFF"),
    ("ignore_check_constraints", "OFF"),
    ("case_sensitive_like", "OFF"),
];

/// Raw page access: `sqlite_dbpage` reads (and, without defensive mode,
/// writes) pages as bytes, freed ones included; `dbstat` describes them.
const RAW_PAGE_TABLES: &[&str] = &["sqlite_dbpage", "dbstat"];

/// Functions that reach outside the database.
const FUNCTIONS: &[&str] = &["load_extension", "fts3_tokenizer"];

thread_local! {
    /// The authorizer's last refusal on this thread, read back when the
    /// SQLITE_AUTH error it caused is classified (same thread, same call).
    static LAST_REFUSAL: Cell<Option<Refusal>> = const { Cell::new(None) };
}

/// The reason for the SQLITE_AUTH error being classified now.
pub(crate) fn take_refusal() -> Option<Refusal> {
    LAST_REFUSAL.with(Cell::take)
}

fn refuse(r: Refusal) -> Authorization {
    LAST_REFUSAL.with(|c| c.set(Some(r)));
    Authorization::Deny
}

fn is_one_of(name: &str, list: &[&str]) -> bool {
    list.iter().any(|n| n.eq_ignore_ascii_case(name))
}

/// The policy. Returns the decision; marks `flags` DIRTY for an allowed
/// setting change.
fn authorize(flags: &AtomicU8, db: Handle, ctx: &AuthContext<'_>) -> Authorization {
    let f = flags.load(Ordering::SeqCst);
    if f & ENGINE != 0 {
        return Authorization::Allow;
    }
    match ctx.action {
        // VACUUM attaches a nameless temporary database while it runs;
        // anything else (a literal, a bound parameter or expression, which
        // SQLite reports without a filename, a URI, VACUUM INTO) is refused.
        AuthAction::Attach { filename } if filename.is_empty() && db.statement_running() => {
            Authorization::Allow
        }
        AuthAction::Attach { .. } | AuthAction::Detach { .. } => refuse(Refusal::Attach),
        AuthAction::Pragma {
            pragma_name,
            pragma_value,
        } => pragma(flags, pragma_name, pragma_value),
        AuthAction::Read { table_name, .. }
        | AuthAction::Insert { table_name }
        | AuthAction::Update { table_name, .. }
        | AuthAction::Delete { table_name }
            if is_one_of(table_name, RAW_PAGE_TABLES) =>
        {
            refuse(Refusal::RawPages {
                table: table_name.to_string(),
            })
        }
        AuthAction::CreateVtable { module_name, .. }
        | AuthAction::DropVtable { module_name, .. }
            if is_one_of(module_name, RAW_PAGE_TABLES) =>
        {
            refuse(Refusal::RawPages {
                table: module_name.to_string(),
            })
        }
        AuthAction::Function { function_name } if is_one_of(function_name, FUNCTIONS) => {
            refuse(Refusal::Function {
                name: function_name.to_string(),
            })
        }
        AuthAction::CreateTempTable { .. }
        | AuthAction::CreateTempIndex { .. }
        | AuthAction::CreateTempTrigger { .. }
        | AuthAction::CreateTempView { .. } => refuse(Refusal::TemporaryObject),
        // Every temporary object is a row in the temp schema table
        // (`CREATE TRIGGER temp.x ON main_table` is reported as a main
        // trigger and caught only here).
        AuthAction::Insert { table_name }
            if is_one_of(table_name, &["sqlite_temp_master", "sqlite_temp_schema"]) =>
        {
            refuse(Refusal::TemporaryObject)
        }
        // `CREATE TABLE temp.x` and the like arrive as the main-schema
        // actions naming the temp schema.
        AuthAction::CreateTable { .. }
        | AuthAction::CreateIndex { .. }
        | AuthAction::CreateTrigger { .. }
        | AuthAction::CreateView { .. }
        | AuthAction::CreateVtable { .. }
            if ctx
                .database_name
                .is_some_and(|d| d.eq_ignore_ascii_case("temp")) =>
        {
            refuse(Refusal::TemporaryObject)
        }
        // Inside a batch, BEGIN/COMMIT/ROLLBACK would end the batch's
        // transaction early. Outside one they are allowed at prepare time
        // (VACUUM begins a transaction internally) and a statement that
        // leaves a transaction open is rolled back and refused.
        AuthAction::Transaction { .. } if f & IN_BATCH != 0 => refuse(Refusal::TransactionControl),
        // An action rusqlite could not decode (for one, an ATTACH whose
        // filename is not a literal arrives without one): refused, so a
        // new or malformed action is never allowed by default.
        AuthAction::Unknown { code, .. } => match code {
            ffi::SQLITE_ATTACH | ffi::SQLITE_DETACH => refuse(Refusal::Attach),
            ffi::SQLITE_PRAGMA => refuse(Refusal::Pragma {
                name: String::from("(unreadable name)"),
                set: false,
            }),
            code => refuse(Refusal::Other { code }),
        },
        _ => Authorization::Allow,
    }
}

fn pragma(flags: &AtomicU8, name: &str, value: Option<&str>) -> Authorization {
    if is_one_of(name, INTROSPECTION) {
        // The argument is a table, index or limit, never a setting.
        return Authorization::Allow;
    }
    if SETTERS.iter().any(|(n, _)| n.eq_ignore_ascii_case(name)) {
        if value.is_some() {
            flags.fetch_or(DIRTY, Ordering::SeqCst);
        }
        return Authorization::Allow;
    }
    refuse(Refusal::Pragma {
        name: name.to_ascii_lowercase(),
        set: value.is_some(),
    })
}

/// Configures a connection for clients; returns the authorizer's flags.
/// `writer`: the one connection that writes, which also gets the database
/// size limit.
pub(crate) fn install(
    conn: &mut Connection,
    limits: &Limits,
    writer: bool,
) -> Result<Arc<AtomicU8>, rusqlite::Error> {
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_WRITABLE_SCHEMA, false)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_TRUSTED_SCHEMA, false)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_FTS3_TOKENIZER, false)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_ATTACH_CREATE, false)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_ATTACH_WRITE, false)?;
    disable_extension_loading(conn)?;
    let clamp = |v: u32| i32::try_from(v).unwrap_or(i32::MAX);
    conn.set_limit(Limit::SQLITE_LIMIT_SQL_LENGTH, clamp(limits.max_sql_bytes))?;
    conn.set_limit(
        Limit::SQLITE_LIMIT_VARIABLE_NUMBER,
        clamp(limits.max_params),
    )?;
    conn.set_limit(Limit::SQLITE_LIMIT_LENGTH, clamp(limits.max_value_bytes))?;
    conn.set_limit(Limit::SQLITE_LIMIT_COLUMN, clamp(limits.max_columns))?;
    // A second wall behind the authorizer: readers never attach anything;
    // the writer only VACUUM's one temporary database.
    conn.set_limit(Limit::SQLITE_LIMIT_ATTACHED, i32::from(writer))?;
    conn.execute_batch(&defaults_sql())?;
    if writer {
        let pages = max_pages(conn, limits)?;
        conn.execute_batch(&format!("PRAGMA max_page_count={pages};"))?;
    }
    // The authorizer's one question: is a statement running (then an
    // ATTACH being prepared is one a running VACUUM issues itself).
    let handle = Handle::of(conn);
    let flags = Arc::new(AtomicU8::new(0));
    let f = Arc::clone(&flags);
    conn.authorizer(Some(move |ctx: AuthContext<'_>| {
        authorize(&f, handle, &ctx)
    }))?;
    Ok(flags)
}

/// `SQLITE_DBCONFIG_ENABLE_LOAD_EXTENSION` off (rusqlite has no setter
/// without its `load_extension` feature): neither the C API nor the SQL
/// function may load code.
fn disable_extension_loading(conn: &Connection) -> Result<(), rusqlite::Error> {
    let mut now: std::ffi::c_int = -1;
    // SAFETY: the connection is live and exclusively ours during setup;
    // this option takes an int and an int* that receives the new state.
    let rc = unsafe {
        ffi::sqlite3_db_config(
            conn.handle(),
            ffi::SQLITE_DBCONFIG_ENABLE_LOAD_EXTENSION,
            0 as std::ffi::c_int,
            &raw mut now,
        )
    };
    if rc != ffi::SQLITE_OK || now != 0 {
        return Err(rusqlite::Error::SqliteFailure(
            ffi::Error::new(if rc == ffi::SQLITE_OK {
                ffi::SQLITE_ERROR
            } else {
                rc
            }),
            Some("could not disable extension loading".into()),
        ));
    }
    Ok(())
}

/// The database size limit in pages (SQLite keeps at least the current
/// size if that is already larger).
pub(crate) fn max_pages(conn: &Connection, limits: &Limits) -> Result<u32, rusqlite::Error> {
    let page_size: u32 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    Ok(pages_for(limits.max_database_bytes, page_size))
}

fn pages_for(bytes: u64, page_size: u32) -> u32 {
    // SQLite's largest page count is 4294967294.
    (bytes / u64::from(page_size.max(1))).clamp(1, u64::from(u32::MAX - 1)) as u32
}

fn defaults_sql() -> String {
    SETTERS
        .iter()
        .map(|(name, value)| format!("PRAGMA {name}={value};"))
        .collect()
}

/// Restores the engine's defaults on a connection a client changed a
/// setting on, before anyone else is served by it. Cheap when clean.
/// On failure the connection stays marked and the next call tries again.
pub(crate) fn reset_if_dirty(c: &Conn) -> Result<(), rusqlite::Error> {
    if c.auth.load(Ordering::SeqCst) & DIRTY == 0 {
        return Ok(());
    }
    // A cached setter would run again without being authorized, and so
    // without marking the connection.
    c.conn.flush_prepared_statement_cache();
    c.auth.fetch_or(ENGINE, Ordering::SeqCst);
    let r = c.conn.execute_batch(&defaults_sql());
    c.auth.fetch_and(!ENGINE, Ordering::SeqCst);
    r?;
    c.auth.fetch_and(!DIRTY, Ordering::SeqCst);
    Ok(())
}

/// Runs `f` as an engine statement: the authorizer allows it. Whatever
/// `f` prepares must not go into the statement cache, except the fixed
/// transaction-control statements of [`Conn::engine_exec_cached`], which
/// the authorizer allows a user outside a batch anyway.
pub(crate) fn as_engine<T>(c: &Conn, f: impl FnOnce(&Connection) -> T) -> T {
    c.auth.fetch_or(ENGINE, Ordering::SeqCst);
    let r = f(&c.conn);
    c.auth.fetch_and(!ENGINE, Ordering::SeqCst);
    r
}

/// The database size limit a primary enforces, for classifying
/// SQLITE_FULL.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SizeLimit {
    pub(crate) max_bytes: u64,
    max_pages: u32,
    /// The capture refuses a transaction larger than this; a transaction
    /// that fails with SQLITE_FULL while the database has more room than
    /// this can only have hit the transaction limit.
    transaction_pages: u64,
}

impl SizeLimit {
    pub(crate) fn new(limits: &Limits, page_size: u32) -> SizeLimit {
        SizeLimit {
            max_bytes: limits.max_database_bytes,
            max_pages: pages_for(limits.max_database_bytes, page_size),
            transaction_pages: limits.max_transaction_bytes / u64::from(page_size.max(1)),
        }
    }

    /// Whether SQLITE_FULL on a database of `db_pages` pages is the size
    /// limit: only if the room left is no more than one transaction may
    /// write (a transaction growing the database past more room than that
    /// would have hit the transaction limit first).
    pub(crate) fn explains_full(&self, db_pages: u32) -> bool {
        u64::from(self.max_pages.saturating_sub(db_pages)) <= self.transaction_pages
    }
}

/// The page size of an open database, read by the engine.
pub(crate) fn page_size(c: &Conn) -> Result<u32, rusqlite::Error> {
    as_engine(c, |conn| {
        conn.query_row("PRAGMA page_size", [], |r| r.get(0))
    })
}

/// The page count of an open database, read by the engine.
pub(crate) fn page_count(c: &Conn) -> Result<u32, rusqlite::Error> {
    as_engine(c, |conn| {
        conn.query_row("PRAGMA page_count", [], |r| r.get(0))
    })
}

impl Database {
    /// Every page of the database as SQLite sees it in one new read
    /// transaction, page 1 first: what a replica must equal byte for byte.
    /// For verification; clients' SQL cannot read raw pages.
    pub fn page_images(&self) -> Result<Vec<Vec<u8>>, QueryError> {
        let reader = self.inner.readers.take(std::time::Duration::from_millis(
            self.inner.limits.pool_wait_ms,
        ))?;
        as_engine(&reader.conn, |conn| {
            let mut stmt = conn.prepare("SELECT data FROM sqlite_dbpage ORDER BY pgno")?;
            let rows = stmt.query_map([], |r| r.get::<_, Vec<u8>>(0))?;
            rows.collect::<Result<Vec<_>, _>>()
        })
        .map_err(QueryError::sql)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_documented_pragmas_pass_and_a_setter_marks_the_connection() {
        let flags = AtomicU8::new(0);
        assert_eq!(
            pragma(&flags, "table_info", Some("t")),
            Authorization::Allow
        );
        assert_eq!(pragma(&flags, "foreign_keys", None), Authorization::Allow);
        assert_eq!(flags.load(Ordering::SeqCst) & DIRTY, 0);
        assert_eq!(
            pragma(&flags, "Foreign_Keys", Some("off")),
            Authorization::Allow
        );
        assert_ne!(flags.load(Ordering::SeqCst) & DIRTY, 0);
        for (name, value) in [
            ("journal_mode", None),
            ("journal_mode", Some("delete")),
            ("writable_schema", Some("1")),
            ("max_page_count", None),
            ("user_version", Some("7")),
            ("temp_store_directory", Some("'/tmp'")),
        ] {
            assert_eq!(pragma(&flags, name, value), Authorization::Deny, "{name}");
            assert_eq!(
                take_refusal(),
                Some(Refusal::Pragma {
                    name: name.to_string(),
                    set: value.is_some()
                })
            );
        }
    }

    #[test]
    fn install_sets_the_walls_behind_the_authorizer() {
        let mut c = Connection::open_in_memory().expect("open");
        let limits = Limits::default();
        install(&mut c, &limits, false).expect("install");
        assert!(
            c.db_config(DbConfig::SQLITE_DBCONFIG_DEFENSIVE)
                .expect("get")
        );
        assert!(
            !c.db_config(DbConfig::SQLITE_DBCONFIG_TRUSTED_SCHEMA)
                .expect("get")
        );
        assert!(
            !c.db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_ATTACH_CREATE)
                .expect("get")
        );
        assert_eq!(
            c.limit(Limit::SQLITE_LIMIT_SQL_LENGTH).expect("get"),
            limits.max_sql_bytes as i32
        );
        assert_eq!(
            c.limit(Limit::SQLITE_LIMIT_VARIABLE_NUMBER).expect("get"),
            limits.max_params as i32
        );
        assert_eq!(
            c.limit(Limit::SQLITE_LIMIT_LENGTH).expect("get"),
            limits.max_value_bytes as i32
        );
        assert_eq!(
            c.limit(Limit::SQLITE_LIMIT_COLUMN).expect("get"),
            limits.max_columns as i32
        );
        // Even without the authorizer a reader attaches nothing.
        c.authorizer(None::<fn(AuthContext<'_>) -> Authorization>)
            .expect("remove authorizer");
        let e = c
            .execute_batch("ATTACH ':memory:' AS x")
            .expect_err("no attach on a reader");
        assert!(e.to_string().contains("too many attached databases"), "{e}");
    }

    #[test]
    fn the_size_limit_explains_sqlite_full_only_within_one_transaction_of_the_limit() {
        let limits = Limits {
            max_database_bytes: 100 * 4096,
            max_transaction_bytes: 10 * 4096,
            ..Limits::default()
        };
        let l = SizeLimit::new(&limits, 4096);
        assert!(l.explains_full(95));
        assert!(l.explains_full(90));
        assert!(!l.explains_full(89));
        assert_eq!(pages_for(u64::MAX, 512), u32::MAX - 1);
        assert_eq!(pages_for(0, 4096), 1);
    }
}
