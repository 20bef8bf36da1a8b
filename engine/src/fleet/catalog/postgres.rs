//! The catalog in PostgreSQL, for a real deployment.
//!
//! The same schema as the embedded catalog; the size fold is the one
//! statement the design calls for: a data-modifying CTE that deletes every
//! pending delta with `RETURNING` and adds their per-account sums, which
//! PostgreSQL runs exactly once and to completion.

use super::{
    AccountLimits, Catalog, CatalogError, CatalogReads, DatabaseRow, Page, Plan, malformed,
    row_from,
};
use crate::fleet::names::{AccountId, DatabaseName, DatabaseUuid};
use parking_lot::Mutex;
use postgres::{Client, NoTls};
use std::sync::Arc;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS databases(
    uuid TEXT PRIMARY KEY, database_id BIGINT NOT NULL, account TEXT NOT NULL,
    name TEXT NOT NULL, node TEXT NOT NULL, location TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL, deleted_at_ms BIGINT);
CREATE UNIQUE INDEX IF NOT EXISTS databases_live_name
    ON databases(account, name) WHERE deleted_at_ms IS NULL;
CREATE INDEX IF NOT EXISTS databases_by_account ON databases(account, created_at_ms);
CREATE INDEX IF NOT EXISTS databases_by_node ON databases(node, uuid) WHERE deleted_at_ms IS NULL;
CREATE TABLE IF NOT EXISTS accounts(
    account TEXT PRIMARY KEY, plan TEXT NOT NULL, max_storage_bytes BIGINT NOT NULL,
    max_rows_read_per_day BIGINT NOT NULL, max_rows_written_per_day BIGINT NOT NULL,
    max_databases BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS database_stats(
    uuid TEXT PRIMARY KEY, account TEXT NOT NULL, size_bytes BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS account_database_stats_changes(
    id BIGSERIAL PRIMARY KEY, account TEXT NOT NULL, delta BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS account_database_stats(
    account TEXT PRIMARY KEY, size_bytes BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS account_counts(account TEXT PRIMARY KEY, live BIGINT NOT NULL);
INSERT INTO account_counts
    SELECT account, count(*) FROM databases WHERE deleted_at_ms IS NULL GROUP BY account
    ON CONFLICT (account) DO NOTHING;
CREATE OR REPLACE FUNCTION walrelay_count_live() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'INSERT' AND NEW.deleted_at_ms IS NULL THEN
        INSERT INTO account_counts(account, live) VALUES (NEW.account, 1)
        ON CONFLICT (account) DO UPDATE SET live = account_counts.live + 1;
    ELSIF TG_OP = 'UPDATE' AND OLD.deleted_at_ms IS NULL AND NEW.deleted_at_ms IS NOT NULL THEN
        UPDATE account_counts SET live = live - 1 WHERE account = NEW.account;
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE OR REPLACE TRIGGER databases_count AFTER INSERT OR UPDATE OF deleted_at_ms
    ON databases FOR EACH ROW EXECUTE FUNCTION walrelay_count_live();
CREATE OR REPLACE FUNCTION walrelay_size_delta() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO account_database_stats_changes(account, delta)
        VALUES (NEW.account, NEW.size_bytes);
    ELSIF NEW.size_bytes <> OLD.size_bytes THEN
        INSERT INTO account_database_stats_changes(account, delta)
        VALUES (NEW.account, NEW.size_bytes - OLD.size_bytes);
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE OR REPLACE TRIGGER database_stats_delta AFTER INSERT OR UPDATE OF size_bytes
    ON database_stats FOR EACH ROW EXECUTE FUNCTION walrelay_size_delta();
";

const ROW_COLUMNS: &str =
    "uuid, database_id, account, name, node, location, created_at_ms, deleted_at_ms";

/// A catalog in PostgreSQL (one connection, serialised; the catalog is
/// off the query path, so its load is creation, heartbeats and the jobs).
pub struct PgCatalog {
    client: Mutex<Client>,
    reads: Arc<CatalogReads>,
}

impl std::fmt::Debug for PgCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgCatalog").finish_non_exhaustive()
    }
}

fn unavailable(e: postgres::Error) -> CatalogError {
    CatalogError::Unavailable(e.to_string())
}

fn database_row(r: &postgres::Row) -> Result<DatabaseRow, CatalogError> {
    let get = |i: usize| -> Result<String, CatalogError> { r.try_get(i).map_err(malformed) };
    row_from(
        &get(0)?,
        r.try_get(1).map_err(malformed)?,
        &get(2)?,
        &get(3)?,
        get(4)?,
        get(5)?,
        r.try_get(6).map_err(malformed)?,
        r.try_get(7).map_err(malformed)?,
    )
}

fn clamp(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

impl PgCatalog {
    /// Connects (`postgres://user@host:port/db`, no TLS: keep it on a
    /// private network) and creates the schema.
    pub fn connect(url: &str, reads: Arc<CatalogReads>) -> Result<PgCatalog, CatalogError> {
        let mut client = Client::connect(url, NoTls).map_err(unavailable)?;
        client.batch_execute(SCHEMA).map_err(unavailable)?;
        Ok(PgCatalog {
            client: Mutex::new(client),
            reads,
        })
    }
}

impl Catalog for PgCatalog {
    fn insert(&self, row: &DatabaseRow, max_databases: u64) -> Result<(), CatalogError> {
        let r = self.client.lock().execute(
            &format!(
                "INSERT INTO databases({ROW_COLUMNS})
                 SELECT $1::TEXT, $2::BIGINT, $3::TEXT, $4::TEXT, $5::TEXT, $6::TEXT,
                        $7::BIGINT, NULL
                 WHERE coalesce((SELECT live FROM account_counts WHERE account = $3::TEXT), 0)
                       < $8::BIGINT"
            ),
            &[
                &row.uuid.to_string(),
                &(row.database_id.0 as i64),
                &row.account.as_str(),
                &row.name.as_str(),
                &row.node,
                &row.location,
                &row.created_at_ms,
                &clamp(max_databases),
            ],
        );
        match r {
            Ok(1) => Ok(()),
            Ok(_) => Err(CatalogError::TooManyDatabases(max_databases)),
            Err(e) if e.code() == Some(&postgres::error::SqlState::UNIQUE_VIOLATION) => {
                Err(CatalogError::NameTaken(row.name.to_string()))
            }
            Err(e) => Err(unavailable(e)),
        }
    }

    fn get(&self, uuid: DatabaseUuid) -> Result<Option<DatabaseRow>, CatalogError> {
        self.reads.count();
        self.client
            .lock()
            .query_opt(
                &format!("SELECT {ROW_COLUMNS} FROM databases WHERE uuid = $1"),
                &[&uuid.to_string()],
            )
            .map_err(unavailable)?
            .as_ref()
            .map(database_row)
            .transpose()
    }

    fn on_node(
        &self,
        node: &str,
        after: Option<DatabaseUuid>,
        limit: u64,
    ) -> Result<Vec<DatabaseRow>, CatalogError> {
        self.reads.count();
        let after = after.map(|u| u.to_string()).unwrap_or_default();
        let limit = limit.min(i64::MAX as u64) as i64;
        self.client
            .lock()
            .query(
                &format!(
                    "SELECT {ROW_COLUMNS} FROM databases
                     WHERE node = $1 AND uuid > $2 AND deleted_at_ms IS NULL
                     ORDER BY uuid LIMIT $3"
                ),
                &[&node, &after, &limit],
            )
            .map_err(unavailable)?
            .iter()
            .map(database_row)
            .collect()
    }

    fn set_node(&self, uuid: DatabaseUuid, node: &str) -> Result<bool, CatalogError> {
        let n = self
            .client
            .lock()
            .execute(
                "UPDATE databases SET node = $2
                 WHERE uuid = $1 AND deleted_at_ms IS NULL",
                &[&uuid.to_string(), &node],
            )
            .map_err(unavailable)?;
        Ok(n == 1)
    }

    fn by_name(
        &self,
        account: &AccountId,
        name: &DatabaseName,
    ) -> Result<Option<DatabaseRow>, CatalogError> {
        self.reads.count();
        self.client
            .lock()
            .query_opt(
                &format!(
                    "SELECT {ROW_COLUMNS} FROM databases
                     WHERE account = $1 AND name = $2 AND deleted_at_ms IS NULL"
                ),
                &[&account.as_str(), &name.as_str()],
            )
            .map_err(unavailable)?
            .as_ref()
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
        self.reads.count();
        self.reads.count();
        let prefix = name_prefix.unwrap_or("");
        let filter = "account = $1 AND deleted_at_ms IS NULL
                      AND left(name, length($2::TEXT)) = $2::TEXT";
        let mut client = self.client.lock();
        let rows = client
            .query(
                &format!(
                    "SELECT {ROW_COLUMNS} FROM databases WHERE {filter}
                     ORDER BY created_at_ms, uuid LIMIT $3 OFFSET $4"
                ),
                &[&account.as_str(), &prefix, &clamp(per_page), &clamp(offset)],
            )
            .map_err(unavailable)?;
        let total: i64 = client
            .query_one(
                &format!("SELECT count(*) FROM databases WHERE {filter}"),
                &[&account.as_str(), &prefix],
            )
            .map_err(unavailable)?
            .try_get(0)
            .map_err(malformed)?;
        Ok(Page {
            rows: rows.iter().map(database_row).collect::<Result<_, _>>()?,
            total: total.max(0) as u64,
        })
    }

    fn mark_deleted(&self, uuid: DatabaseUuid, at_ms: i64) -> Result<bool, CatalogError> {
        let n = self
            .client
            .lock()
            .execute(
                "UPDATE databases SET deleted_at_ms = $2
                 WHERE uuid = $1 AND deleted_at_ms IS NULL",
                &[&uuid.to_string(), &at_ms],
            )
            .map_err(unavailable)?;
        Ok(n == 1)
    }

    fn account(&self, account: &AccountId) -> Result<AccountLimits, CatalogError> {
        self.reads.count();
        let row = self
            .client
            .lock()
            .query_opt(
                "SELECT plan, max_storage_bytes, max_rows_read_per_day,
                        max_rows_written_per_day, max_databases
                 FROM accounts WHERE account = $1",
                &[&account.as_str()],
            )
            .map_err(unavailable)?;
        let Some(r) = row else {
            return Ok(AccountLimits::free(account.clone()));
        };
        let n = |i: usize| -> Result<u64, CatalogError> {
            Ok(r.try_get::<_, i64>(i).map_err(malformed)?.max(0) as u64)
        };
        let plan: String = r.try_get(0).map_err(malformed)?;
        Ok(AccountLimits {
            account: account.clone(),
            plan: Plan::parse(&plan).ok_or_else(|| malformed("plan"))?,
            max_storage_bytes: n(1)?,
            max_rows_read_per_day: n(2)?,
            max_rows_written_per_day: n(3)?,
            max_databases: n(4)?,
        })
    }

    fn set_account(&self, l: &AccountLimits) -> Result<(), CatalogError> {
        self.client
            .lock()
            .execute(
                "INSERT INTO accounts VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT(account) DO UPDATE SET plan = excluded.plan,
                   max_storage_bytes = excluded.max_storage_bytes,
                   max_rows_read_per_day = excluded.max_rows_read_per_day,
                   max_rows_written_per_day = excluded.max_rows_written_per_day,
                   max_databases = excluded.max_databases",
                &[
                    &l.account.as_str(),
                    &l.plan.as_str(),
                    &clamp(l.max_storage_bytes),
                    &clamp(l.max_rows_read_per_day),
                    &clamp(l.max_rows_written_per_day),
                    &clamp(l.max_databases),
                ],
            )
            .map_err(unavailable)?;
        Ok(())
    }

    fn write_sizes(&self, sizes: &[(DatabaseUuid, AccountId, u64)]) -> Result<(), CatalogError> {
        let mut client = self.client.lock();
        let mut tx = client.transaction().map_err(unavailable)?;
        for (uuid, account, bytes) in sizes {
            tx.execute(
                "INSERT INTO database_stats(uuid, account, size_bytes) VALUES ($1, $2, $3)
                 ON CONFLICT(uuid) DO UPDATE SET size_bytes = excluded.size_bytes",
                &[&uuid.to_string(), &account.as_str(), &clamp(*bytes)],
            )
            .map_err(unavailable)?;
        }
        tx.commit().map_err(unavailable)
    }

    fn fold_size_deltas(&self) -> Result<u64, CatalogError> {
        let row = self
            .client
            .lock()
            .query_one(
                "WITH consumed AS (
                     DELETE FROM account_database_stats_changes RETURNING account, delta
                 ), summed AS (
                     SELECT account, sum(delta)::BIGINT AS delta, count(*) AS n
                     FROM consumed GROUP BY account
                 ), folded AS (
                     INSERT INTO account_database_stats(account, size_bytes)
                     SELECT account, delta FROM summed
                     ON CONFLICT(account) DO UPDATE
                       SET size_bytes = account_database_stats.size_bytes + excluded.size_bytes
                     RETURNING 1
                 )
                 SELECT coalesce((SELECT sum(n) FROM summed), 0)::BIGINT
                        + 0 * (SELECT count(*) FROM folded)",
                &[],
            )
            .map_err(unavailable)?;
        let n: i64 = row.try_get(0).map_err(malformed)?;
        Ok(n.max(0) as u64)
    }

    fn account_storage_bytes(&self, account: &AccountId) -> Result<u64, CatalogError> {
        self.reads.count();
        let row = self
            .client
            .lock()
            .query_opt(
                "SELECT size_bytes FROM account_database_stats WHERE account = $1",
                &[&account.as_str()],
            )
            .map_err(unavailable)?;
        Ok(row
            .map(|r| r.try_get::<_, i64>(0))
            .transpose()
            .map_err(malformed)?
            .unwrap_or(0)
            .max(0) as u64)
    }
}
