//! The embedded catalog: a walrelay [`Database`], so the catalog is
//! replicated (and snapshotted, and failed over) like any database.

use super::{
    AccountLimits, Catalog, CatalogError, CatalogReads, DatabaseRow, Page, Plan, malformed,
    row_from,
};
use crate::fleet::names::{AccountId, DatabaseName, DatabaseUuid};
use crate::{Constraint, Database, QueryError, Row, Session, Value};
use std::sync::Arc;

/// The schema, one statement per entry (run in order, idempotent).
const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS databases(
        uuid TEXT PRIMARY KEY, database_id INTEGER NOT NULL, account TEXT NOT NULL,
        name TEXT NOT NULL, node TEXT NOT NULL, location TEXT NOT NULL,
        created_at_ms INTEGER NOT NULL, deleted_at_ms INTEGER)",
    "CREATE UNIQUE INDEX IF NOT EXISTS databases_live_name
        ON databases(account, name) WHERE deleted_at_ms IS NULL",
    "CREATE INDEX IF NOT EXISTS databases_by_account ON databases(account, created_at_ms)",
    "CREATE INDEX IF NOT EXISTS databases_by_node ON databases(node, uuid)
        WHERE deleted_at_ms IS NULL",
    "CREATE TABLE IF NOT EXISTS accounts(
        account TEXT PRIMARY KEY, plan TEXT NOT NULL, max_storage_bytes INTEGER NOT NULL,
        max_rows_read_per_day INTEGER NOT NULL, max_rows_written_per_day INTEGER NOT NULL,
        max_databases INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS database_stats(
        uuid TEXT PRIMARY KEY, account TEXT NOT NULL, size_bytes INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS account_database_stats_changes(
        id INTEGER PRIMARY KEY, account TEXT NOT NULL, delta INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS account_database_stats(
        account TEXT PRIMARY KEY, size_bytes INTEGER NOT NULL)",
    // Live databases per account, kept by triggers, so that creation's
    // cap check reads one row instead of counting the account's databases.
    "CREATE TABLE IF NOT EXISTS account_counts(account TEXT PRIMARY KEY, live INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO account_counts
        SELECT account, count(*) FROM databases WHERE deleted_at_ms IS NULL GROUP BY account",
    "CREATE TRIGGER IF NOT EXISTS databases_count_insert AFTER INSERT ON databases
     WHEN new.deleted_at_ms IS NULL
     BEGIN
        INSERT INTO account_counts(account, live) VALUES (new.account, 1)
        ON CONFLICT(account) DO UPDATE SET live = live + 1;
     END",
    "CREATE TRIGGER IF NOT EXISTS databases_count_delete AFTER UPDATE OF deleted_at_ms ON databases
     WHEN old.deleted_at_ms IS NULL AND new.deleted_at_ms IS NOT NULL
     BEGIN
        UPDATE account_counts SET live = live - 1 WHERE account = new.account;
     END",
    "CREATE TRIGGER IF NOT EXISTS database_stats_insert AFTER INSERT ON database_stats
     BEGIN
        INSERT INTO account_database_stats_changes(account, delta)
        VALUES (new.account, new.size_bytes);
     END",
    "CREATE TRIGGER IF NOT EXISTS database_stats_update AFTER UPDATE OF size_bytes
     ON database_stats WHEN new.size_bytes != old.size_bytes
     BEGIN
        INSERT INTO account_database_stats_changes(account, delta)
        VALUES (new.account, new.size_bytes - old.size_bytes);
     END",
];

const ROW_COLUMNS: &str =
    "uuid, database_id, account, name, node, location, created_at_ms, deleted_at_ms";

/// A catalog kept in a walrelay database.
#[derive(Debug, Clone)]
pub struct SqliteCatalog {
    db: Database,
    reads: Arc<CatalogReads>,
}

fn unavailable(e: QueryError) -> CatalogError {
    CatalogError::Unavailable(e.to_string())
}

fn text(row: &Row, col: &str) -> Result<String, CatalogError> {
    match row.get(col) {
        Some(Value::Text(s)) => Ok(s.clone()),
        other => Err(malformed(format!("{col} is {other:?}"))),
    }
}

fn int(row: &Row, col: &str) -> Result<i64, CatalogError> {
    row.get(col)
        .and_then(Value::as_i64)
        .ok_or_else(|| malformed(format!("{col} is not an integer")))
}

fn database_row(row: &Row) -> Result<DatabaseRow, CatalogError> {
    let deleted = match row.get("deleted_at_ms") {
        Some(Value::Null) | None => None,
        Some(v) => Some(v.as_i64().ok_or_else(|| malformed("deleted_at_ms"))?),
    };
    row_from(
        &text(row, "uuid")?,
        int(row, "database_id")?,
        &text(row, "account")?,
        &text(row, "name")?,
        text(row, "node")?,
        text(row, "location")?,
        int(row, "created_at_ms")?,
        deleted,
    )
}

fn is_unique_violation(e: &QueryError) -> bool {
    match e {
        QueryError::Sql { message, .. } => message.contains("UNIQUE constraint failed"),
        QueryError::Batch { source, .. } => is_unique_violation(source),
        _ => false,
    }
}

impl SqliteCatalog {
    /// Uses `db` (a primary) as the catalog, creating the schema.
    pub fn open(db: Database, reads: Arc<CatalogReads>) -> Result<SqliteCatalog, CatalogError> {
        let catalog = SqliteCatalog { db, reads };
        let s = catalog.session()?;
        s.batch(SCHEMA.iter().map(|sql| s.prepare(*sql)))
            .map_err(unavailable)?;
        Ok(catalog)
    }

    pub fn database(&self) -> &Database {
        &self.db
    }

    fn session(&self) -> Result<Session, CatalogError> {
        self.db
            .session(Constraint::FirstPrimary)
            .map_err(|e| CatalogError::Unavailable(e.to_string()))
    }

    fn query(&self, sql: &str, params: Vec<Value>) -> Result<Vec<Row>, CatalogError> {
        self.reads.count();
        let s = self.session()?;
        Ok(s.prepare(sql)
            .bind(params)
            .all()
            .map_err(unavailable)?
            .results)
    }
}

impl Catalog for SqliteCatalog {
    fn insert(&self, row: &DatabaseRow, max_databases: u64) -> Result<(), CatalogError> {
        let s = self.session()?;
        let r = s
            .prepare(format!(
                "INSERT INTO databases({ROW_COLUMNS})
                 SELECT $1, $2, $3, $4, $5, $6, $7, NULL
                 WHERE coalesce((SELECT live FROM account_counts WHERE account = $3), 0) < $8"
            ))
            .bind([
                Value::Text(row.uuid.to_string()),
                Value::Integer(row.database_id.0 as i64),
                Value::Text(row.account.to_string()),
                Value::Text(row.name.to_string()),
                Value::Text(row.node.clone()),
                Value::Text(row.location.clone()),
                Value::Integer(row.created_at_ms),
                Value::Integer(max_databases.min(i64::MAX as u64) as i64),
            ])
            .run();
        match r {
            // The trigger's row counts too: any change means inserted.
            Ok(r) if r.meta.changes >= 1 => Ok(()),
            Ok(_) => Err(CatalogError::TooManyDatabases(max_databases)),
            Err(e) if is_unique_violation(&e) => Err(CatalogError::NameTaken(row.name.to_string())),
            Err(e) => Err(unavailable(e)),
        }
    }

    fn get(&self, uuid: DatabaseUuid) -> Result<Option<DatabaseRow>, CatalogError> {
        self.query(
            &format!("SELECT {ROW_COLUMNS} FROM databases WHERE uuid = $1"),
            vec![Value::Text(uuid.to_string())],
        )?
        .first()
        .map(database_row)
        .transpose()
    }

    fn on_node(
        &self,
        node: &str,
        after: Option<DatabaseUuid>,
        limit: u64,
    ) -> Result<Vec<DatabaseRow>, CatalogError> {
        self.query(
            &format!(
                "SELECT {ROW_COLUMNS} FROM databases
                 WHERE node = $1 AND uuid > $2 AND deleted_at_ms IS NULL
                 ORDER BY uuid LIMIT $3"
            ),
            vec![
                Value::Text(node.to_string()),
                Value::Text(after.map(|u| u.to_string()).unwrap_or_default()),
                Value::Integer(limit.min(i64::MAX as u64) as i64),
            ],
        )?
        .iter()
        .map(database_row)
        .collect()
    }

    fn set_node(&self, uuid: DatabaseUuid, node: &str) -> Result<bool, CatalogError> {
        let s = self.session()?;
        let r = s
            .prepare(
                "UPDATE databases SET node = $1
                 WHERE uuid = $2 AND deleted_at_ms IS NULL",
            )
            .bind([Value::Text(node.to_string()), Value::Text(uuid.to_string())])
            .run()
            .map_err(unavailable)?;
        Ok(r.meta.changes >= 1)
    }

    fn by_name(
        &self,
        account: &AccountId,
        name: &DatabaseName,
    ) -> Result<Option<DatabaseRow>, CatalogError> {
        self.query(
            &format!(
                "SELECT {ROW_COLUMNS} FROM databases
                 WHERE account = $1 AND name = $2 AND deleted_at_ms IS NULL"
            ),
            vec![
                Value::Text(account.to_string()),
                Value::Text(name.to_string()),
            ],
        )?
        .first()
        .map(database_row)
        .transpose()
    }

    fn list(
        &self,
        account: &AccountId,
        name_prefix: Option<&str>,
        offset: u64,
        per_page: u64,
    ) -> Result<Page, CatalogError> {
        // A prefix match without LIKE's wildcards: substr compares exactly.
        let prefix = name_prefix.unwrap_or("").to_string();
        let filter = "account = $1 AND deleted_at_ms IS NULL
                      AND substr(name, 1, length($2)) = $2";
        let rows = self.query(
            &format!(
                "SELECT {ROW_COLUMNS} FROM databases WHERE {filter}
                 ORDER BY created_at_ms, uuid LIMIT $3 OFFSET $4"
            ),
            vec![
                Value::Text(account.to_string()),
                Value::Text(prefix.clone()),
                Value::Integer(per_page.min(i64::MAX as u64) as i64),
                Value::Integer(offset.min(i64::MAX as u64) as i64),
            ],
        )?;
        let total = self.query(
            &format!("SELECT count(*) AS n FROM databases WHERE {filter}"),
            vec![Value::Text(account.to_string()), Value::Text(prefix)],
        )?;
        Ok(Page {
            rows: rows.iter().map(database_row).collect::<Result<_, _>>()?,
            total: total.first().map_or(Ok(0), |r| int(r, "n"))? as u64,
        })
    }

    fn mark_deleted(&self, uuid: DatabaseUuid, at_ms: i64) -> Result<bool, CatalogError> {
        let s = self.session()?;
        let r = s
            .prepare(
                // SQLite numbers `$n` parameters in order of appearance.
                "UPDATE databases SET deleted_at_ms = $1
                 WHERE uuid = $2 AND deleted_at_ms IS NULL",
            )
            .bind([Value::Integer(at_ms), Value::Text(uuid.to_string())])
            .run()
            .map_err(unavailable)?;
        // The count trigger's row is in `changes` too.
        Ok(r.meta.changes >= 1)
    }

    fn account(&self, account: &AccountId) -> Result<AccountLimits, CatalogError> {
        let rows = self.query(
            "SELECT plan, max_storage_bytes, max_rows_read_per_day, max_rows_written_per_day,
                    max_databases FROM accounts WHERE account = $1",
            vec![Value::Text(account.to_string())],
        )?;
        let Some(r) = rows.first() else {
            return Ok(AccountLimits::free(account.clone()));
        };
        Ok(AccountLimits {
            account: account.clone(),
            plan: Plan::parse(&text(r, "plan")?).ok_or_else(|| malformed("plan"))?,
            max_storage_bytes: int(r, "max_storage_bytes")? as u64,
            max_rows_read_per_day: int(r, "max_rows_read_per_day")? as u64,
            max_rows_written_per_day: int(r, "max_rows_written_per_day")? as u64,
            max_databases: int(r, "max_databases")? as u64,
        })
    }

    fn set_account(&self, l: &AccountLimits) -> Result<(), CatalogError> {
        let clamp = |v: u64| Value::Integer(v.min(i64::MAX as u64) as i64);
        let s = self.session()?;
        s.prepare(
            "INSERT INTO accounts VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT(account) DO UPDATE SET plan = excluded.plan,
               max_storage_bytes = excluded.max_storage_bytes,
               max_rows_read_per_day = excluded.max_rows_read_per_day,
               max_rows_written_per_day = excluded.max_rows_written_per_day,
               max_databases = excluded.max_databases",
        )
        .bind([
            Value::Text(l.account.to_string()),
            Value::Text(l.plan.as_str().into()),
            clamp(l.max_storage_bytes),
            clamp(l.max_rows_read_per_day),
            clamp(l.max_rows_written_per_day),
            clamp(l.max_databases),
        ])
        .run()
        .map_err(unavailable)?;
        Ok(())
    }

    fn write_sizes(&self, sizes: &[(DatabaseUuid, AccountId, u64)]) -> Result<(), CatalogError> {
        if sizes.is_empty() {
            return Ok(());
        }
        let s = self.session()?;
        s.batch(sizes.iter().map(|(uuid, account, bytes)| {
            s.prepare(
                "INSERT INTO database_stats(uuid, account, size_bytes) VALUES ($1, $2, $3)
                 ON CONFLICT(uuid) DO UPDATE SET size_bytes = excluded.size_bytes",
            )
            .bind([
                Value::Text(uuid.to_string()),
                Value::Text(account.to_string()),
                Value::Integer((*bytes).min(i64::MAX as u64) as i64),
            ])
        }))
        .map_err(unavailable)?;
        Ok(())
    }

    fn fold_size_deltas(&self) -> Result<u64, CatalogError> {
        // SQLite has no DELETE ... RETURNING inside a CTE; the same effect
        // is one transaction (the single writer serialises it with the
        // trigger's inserts): add every pending delta, then delete them.
        let s = self.session()?;
        let r = s
            .batch([
                s.prepare(
                    "INSERT INTO account_database_stats(account, size_bytes)
                     SELECT account, sum(delta) FROM account_database_stats_changes
                     WHERE true GROUP BY account
                     ON CONFLICT(account) DO UPDATE
                       SET size_bytes = size_bytes + excluded.size_bytes",
                ),
                s.prepare("DELETE FROM account_database_stats_changes"),
            ])
            .map_err(unavailable)?;
        Ok(r.last().map_or(0, |r| r.meta.changes))
    }

    fn account_storage_bytes(&self, account: &AccountId) -> Result<u64, CatalogError> {
        let rows = self.query(
            "SELECT size_bytes FROM account_database_stats WHERE account = $1",
            vec![Value::Text(account.to_string())],
        )?;
        Ok(rows.first().map_or(Ok(0), |r| int(r, "size_bytes"))?.max(0) as u64)
    }
}
