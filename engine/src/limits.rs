//! Per-database limits. D1's published limits are the defaults; every one
//! is configurable through [`crate::Options::limits`].
//!
//! | limit | default | enforced by |
//! |---|---|---|
//! | query time | 30 s | a progress handler on every connection |
//! | SQL text | 100,000 bytes | `SQLITE_LIMIT_SQL_LENGTH` |
//! | bound parameters | 100 | `SQLITE_LIMIT_VARIABLE_NUMBER` |
//! | string, blob or row | 2,000,000 bytes | `SQLITE_LIMIT_LENGTH` |
//! | columns | 100 | `SQLITE_LIMIT_COLUMN` |
//! | database size | 10 GB | `max_page_count` on the writer |
//! | response size | 32 MiB | the row collector |
//! | wait for a connection | 1 s | the pools (then 503 with Retry-After) |
//! | write transaction | 1 GiB | the capture, before the commit |

/// The limits one database enforces. See the module table for defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A statement (or batch) running longer is interrupted.
    pub query_timeout_ms: u64,
    /// Longest SQL text of one statement, in bytes.
    pub max_sql_bytes: u32,
    /// Most bound parameters one statement may have.
    pub max_params: u32,
    /// Largest string, blob or row, in bytes.
    pub max_value_bytes: u32,
    /// Most columns in a table, index, view or result.
    pub max_columns: u32,
    /// Largest the database file may grow to, in bytes.
    pub max_database_bytes: u64,
    /// Largest result a statement may return (the sum of its values'
    /// sizes), in bytes.
    pub max_response_bytes: u64,
    /// Longest a request waits for a pooled connection (or the writer).
    pub pool_wait_ms: u64,
    /// Largest write transaction (the page images it changes), in bytes.
    /// A larger one is refused before it commits.
    pub max_transaction_bytes: u64,
}

/// The smallest `max_transaction_bytes` a database opens with: four 4 KiB
/// pages, room for the engine's own first writes (an epoch's first
/// record, a table's creation) and a one-row insert. Below it writes
/// would be refused, the first one as a confusing "disk full".
pub const MIN_TRANSACTION_BYTES: u64 = 16 << 10;

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            query_timeout_ms: 30_000,
            max_sql_bytes: 100_000,
            max_params: 100,
            max_value_bytes: 2_000_000,
            max_columns: 100,
            max_database_bytes: 10_000_000_000,
            max_response_bytes: 32 << 20,
            pool_wait_ms: 1_000,
            max_transaction_bytes: 1 << 30,
        }
    }
}
