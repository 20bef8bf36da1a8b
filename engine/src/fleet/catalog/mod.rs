//! The catalog: the fleet's source of truth (D1's "Core" Postgres).
//!
//! One row per database that was ever checkpointed, its account's limits,
//! and the storage totals the limit pipeline keeps. Two backends implement
//! [`Catalog`] with the same schema and, where the dialects agree, the
//! same SQL: [`SqliteCatalog`] (the embedded default, a walrelay database
//! itself, so it is replicated like any other) and [`PgCatalog`]
//! (PostgreSQL, for a real deployment).
//!
//! The query path never calls a catalog: it is read by creation, listing,
//! deletion, heartbeats and the limit jobs only. Every read is counted
//! ([`CatalogReads`]), and a read made while a query runs on the same
//! thread is counted separately (the metric that must stay 0).
//!
//! Schema (both backends):
//!
//! ```text
//! databases(uuid PK, database_id, account, name, node, location,
//!           created_at_ms, deleted_at_ms NULL)
//!     UNIQUE (account, name) among rows with deleted_at_ms NULL
//! accounts(account PK, plan 'free'|'paid', max_storage_bytes,
//!          max_rows_read_per_day, max_rows_written_per_day, max_databases)
//! database_stats(uuid PK, account, size_bytes)      latest size per database
//! account_database_stats_changes(id, account, delta) written by a trigger
//!                                                  on database_stats
//! account_database_stats(account PK, size_bytes)    folded once a second
//! ```

mod postgres;
mod sqlite;

pub use postgres::PgCatalog;
pub use sqlite::SqliteCatalog;

use super::names::{AccountId, DatabaseName, DatabaseUuid};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use walrelay_replicator::DatabaseId;

/// A database's catalog row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseRow {
    pub uuid: DatabaseUuid,
    pub database_id: DatabaseId,
    pub account: AccountId,
    pub name: DatabaseName,
    /// The node that hosts its primary (its HTTP base URL).
    pub node: String,
    /// The location hint it was created with ("" if none).
    pub location: String,
    pub created_at_ms: i64,
    pub deleted_at_ms: Option<i64>,
}

/// An account's plan and limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountLimits {
    pub account: AccountId,
    pub plan: Plan,
    pub max_storage_bytes: u64,
    pub max_rows_read_per_day: u64,
    pub max_rows_written_per_day: u64,
    pub max_databases: u64,
}

/// Free accounts have daily row limits; paid ones do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    Free,
    Paid,
}

impl Plan {
    pub fn as_str(self) -> &'static str {
        match self {
            Plan::Free => "free",
            Plan::Paid => "paid",
        }
    }
    pub fn parse(text: &str) -> Option<Plan> {
        match text {
            "free" => Some(Plan::Free),
            "paid" => Some(Plan::Paid),
            _ => None,
        }
    }
}

impl AccountLimits {
    /// D1's Free plan: 5 GB, 5 million rows read and 100,000 written a
    /// day, 10 databases (raised here to 1,000,000 so the fleet benchmark
    /// fits one account).
    pub fn free(account: AccountId) -> AccountLimits {
        AccountLimits {
            account,
            plan: Plan::Free,
            max_storage_bytes: 5_000_000_000,
            max_rows_read_per_day: 5_000_000,
            max_rows_written_per_day: 100_000,
            max_databases: 1_000_000,
        }
    }
}

/// Why a catalog call failed.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The account already has a live database of that name.
    #[error("the account already has a database named {0:?}")]
    NameTaken(String),
    /// The account holds its maximum number of databases.
    #[error("the account already holds its limit of {0} databases")]
    TooManyDatabases(u64),
    /// The backend failed (connection, I/O, SQL): the call may be retried.
    #[error("the catalog is unavailable: {0}")]
    Unavailable(String),
    /// A stored value is not what the schema allows.
    #[error("the catalog holds a malformed row: {0}")]
    Malformed(String),
    /// A test's fault injection.
    #[error("injected catalog fault")]
    Injected,
}

/// A page of an account's databases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub rows: Vec<DatabaseRow>,
    /// Live databases of the account matching the filter.
    pub total: u64,
}

/// The source of truth. Implementations are safe to share between threads.
pub trait Catalog: Send + Sync + std::fmt::Debug {
    /// Writes a new database's row: the creation checkpoint. Fails with
    /// `NameTaken` if the account has a live database of that name and with
    /// `TooManyDatabases` at the account's cap.
    fn insert(&self, row: &DatabaseRow, max_databases: u64) -> Result<(), CatalogError>;
    /// A database by uuid, deleted or not.
    fn get(&self, uuid: DatabaseUuid) -> Result<Option<DatabaseRow>, CatalogError>;
    /// Live databases placed on `node`, at most `limit`, in uuid order
    /// after `after` (failover pages through a dead node's databases).
    fn on_node(
        &self,
        node: &str,
        after: Option<DatabaseUuid>,
        limit: u64,
    ) -> Result<Vec<DatabaseRow>, CatalogError>;
    /// Places a live database on `node` (failover); false if it is not
    /// live.
    fn set_node(&self, uuid: DatabaseUuid, node: &str) -> Result<bool, CatalogError>;
    /// A live database by account and name.
    fn by_name(
        &self,
        account: &AccountId,
        name: &DatabaseName,
    ) -> Result<Option<DatabaseRow>, CatalogError>;
    /// An account's live databases in creation order, `per_page` from
    /// `offset`, optionally only names starting with `name_prefix`.
    fn list(
        &self,
        account: &AccountId,
        name_prefix: Option<&str>,
        offset: u64,
        per_page: u64,
    ) -> Result<Page, CatalogError>;
    /// Marks a database deleted (its name is free again); false if it was
    /// unknown or already deleted.
    fn mark_deleted(&self, uuid: DatabaseUuid, at_ms: i64) -> Result<bool, CatalogError>;
    /// An account's limits (the Free plan's if it has no row).
    fn account(&self, account: &AccountId) -> Result<AccountLimits, CatalogError>;
    /// Creates or replaces an account's limits.
    fn set_account(&self, limits: &AccountLimits) -> Result<(), CatalogError>;
    /// Writes each database's latest size (`database_stats`); the trigger
    /// turns every change into a delta row.
    fn write_sizes(&self, sizes: &[(DatabaseUuid, AccountId, u64)]) -> Result<(), CatalogError>;
    /// Folds every pending delta into the per-account totals, atomically,
    /// in one statement where the backend allows; returns the deltas
    /// consumed.
    fn fold_size_deltas(&self) -> Result<u64, CatalogError>;
    /// An account's folded storage total.
    fn account_storage_bytes(&self, account: &AccountId) -> Result<u64, CatalogError>;
}

thread_local! {
    /// Set while this thread runs a client's query.
    static ON_QUERY_PATH: Cell<bool> = const { Cell::new(false) };
}

/// Marks the current thread as running a query until dropped.
#[derive(Debug)]
pub struct QueryPathGuard(bool);

impl QueryPathGuard {
    pub fn enter() -> QueryPathGuard {
        QueryPathGuard(ON_QUERY_PATH.with(|c| c.replace(true)))
    }
}

impl Drop for QueryPathGuard {
    fn drop(&mut self) {
        ON_QUERY_PATH.with(|c| c.set(self.0));
    }
}

/// Counts catalog reads: all of them, and those made on a query path.
#[derive(Debug, Default)]
pub struct CatalogReads {
    total: AtomicU64,
    on_query_path: AtomicU64,
}

impl CatalogReads {
    /// Counts one read by the current thread.
    pub fn count(&self) {
        self.total.fetch_add(1, Ordering::Relaxed);
        if ON_QUERY_PATH.with(Cell::get) {
            self.on_query_path.fetch_add(1, Ordering::Relaxed);
            tracing::error!("a catalog read on the query path");
        }
    }
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
    pub fn on_query_path(&self) -> u64 {
        self.on_query_path.load(Ordering::Relaxed)
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

pub(super) fn malformed(what: impl std::fmt::Display) -> CatalogError {
    CatalogError::Malformed(what.to_string())
}

/// Builds a row from its stored columns, checking each.
#[allow(clippy::too_many_arguments)]
pub(super) fn row_from(
    uuid: &str,
    database_id: i64,
    account: &str,
    name: &str,
    node: String,
    location: String,
    created_at_ms: i64,
    deleted_at_ms: Option<i64>,
) -> Result<DatabaseRow, CatalogError> {
    Ok(DatabaseRow {
        uuid: uuid.parse().map_err(malformed)?,
        database_id: DatabaseId(database_id as u64),
        account: AccountId::new(account).map_err(malformed)?,
        name: DatabaseName::new(name).map_err(malformed)?,
        node,
        location,
        created_at_ms,
        deleted_at_ms,
    })
}
