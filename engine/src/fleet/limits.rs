//! Account limits, kept off the query path (D1's steps 4 and 5).
//!
//! Storage: each host node collects its open databases' sizes and, once a
//! tick, sends the changed ones to the control plane, which appends them
//! to a durable queue ([`SizeQueue`]: a local SQLite file by default, or
//! a stream on an existing Redis broker, standing in for D1's Kafka-like
//! queue). At most `consumers` consumer threads take batches
//! from it and write each database's latest size to the catalog; the
//! catalog's trigger turns each change into a delta row, and a job folds
//! the deltas into per-account totals once a second
//! ([`Catalog::fold_size_deltas`]). Heartbeats read the totals through a
//! cache keyed by account and time bucket; a database whose account is
//! over refuses writes that would grow it
//! ([`Database::freeze_growth`](crate::Database::freeze_growth)).
//!
//! Rows: every query's rows read and written are counted per database on
//! its host and sent with the sizes as usage events, which land in an
//! analytics table ([`Analytics`], standing in for ClickHouse). The
//! [`Limiter`] periodically finds free-plan accounts over a daily limit
//! and sets a key for each that expires at the end of the (UTC) day, in a
//! limit cache standing in for Quicksilver; every node receives the keys
//! in the answer to its next report and turns the account's queries away.
//!
//! Both limits act late by design: a tick, a consumer pass, the fold, the
//! cache bucket and a heartbeat for storage; a tick, the limiter's period
//! and a tick for rows (measured in `papers/fleet.md`).

use super::catalog::{AccountLimits, Catalog, CatalogError, Plan, now_ms};
use super::names::{AccountId, DatabaseUuid};
pub use super::size_queue::{LocalSizeQueue, MAX_QUEUE_ENTRIES, SizeQueue, Taken};
use parking_lot::Mutex;
use rusqlite::{Connection, params};
use std::collections::HashMap;
use std::path::Path;

/// One database's size, as published.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SizeReport {
    pub uuid: String,
    pub account: String,
    pub size_bytes: u64,
}

/// One database's rows since its last report.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UsageEvent {
    pub uuid: String,
    pub account: String,
    pub rows_read: u64,
    pub rows_written: u64,
    pub at_ms: i64,
}

/// What a host node sends each tick.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Report {
    pub sizes: Vec<SizeReport>,
    pub usage: Vec<UsageEvent>,
}

/// An account whose queries are refused until `until_ms`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Blocked {
    pub account: String,
    pub until_ms: i64,
}

/// The answer to a report: the limit cache's keys.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReportAnswer {
    pub blocked: Vec<Blocked>,
}

/// Why a limits store failed.
#[derive(Debug, thiserror::Error)]
pub enum LimitsError {
    #[error("limits storage: {0}")]
    Storage(#[from] rusqlite::Error),
    #[error("a malformed queue entry: {0}")]
    Malformed(String),
    #[error("the size queue's broker: {0}")]
    Broker(#[from] redis::RedisError),
    #[error("--size-queue must be `local` or a redis:// URL, not {0:?}")]
    QueueSpec(String),
    #[error(transparent)]
    Catalog(#[from] CatalogError),
}

pub(super) fn open_sqlite(path: &Path, schema: &str) -> Result<Connection, LimitsError> {
    let conn = Connection::open(path)?;
    conn.execute_batch(&format!(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; {schema}"
    ))?;
    Ok(conn)
}

/// Writes one consumer batch to the catalog: each database's latest size.
pub fn consume(
    queue: &dyn SizeQueue,
    catalog: &dyn Catalog,
    max: usize,
) -> Result<usize, LimitsError> {
    let taken = queue.take(max)?;
    let batch = &taken.reports;
    if batch.is_empty() {
        return Ok(0);
    }
    let mut latest: HashMap<DatabaseUuid, (AccountId, u64)> = HashMap::new();
    for r in batch {
        let (Ok(uuid), Ok(account)) = (r.uuid.parse::<DatabaseUuid>(), AccountId::new(&r.account))
        else {
            tracing::warn!(uuid = %r.uuid, "dropping a malformed size report");
            continue;
        };
        latest.insert(uuid, (account, r.size_bytes));
    }
    let sizes: Vec<(DatabaseUuid, AccountId, u64)> =
        latest.into_iter().map(|(u, (a, s))| (u, a, s)).collect();
    catalog.write_sizes(&sizes)?;
    // Only once the catalog has them: a consumer that dies before this
    // leaves them to be taken again (where the queue keeps them).
    queue.ack(&taken)?;
    Ok(batch.len())
}

/// The start of the UTC day of `ms`, and its end.
pub fn day_bounds_ms(ms: i64) -> (i64, i64) {
    let day = 86_400_000;
    let start = ms.div_euclid(day) * day;
    (start, start + day)
}

/// Usage events (D1's ClickHouse, standing in).
#[derive(Debug)]
pub struct Analytics {
    conn: Mutex<Connection>,
}

impl Analytics {
    pub fn open(path: &Path) -> Result<Analytics, LimitsError> {
        Ok(Analytics {
            conn: Mutex::new(open_sqlite(
                path,
                "CREATE TABLE IF NOT EXISTS usage(account TEXT NOT NULL, uuid TEXT NOT NULL,
                    at_ms INTEGER NOT NULL, rows_read INTEGER NOT NULL,
                    rows_written INTEGER NOT NULL);
                 CREATE INDEX IF NOT EXISTS usage_by_time ON usage(at_ms, account);",
            )?),
        })
    }

    pub fn insert(&self, events: &[UsageEvent]) -> Result<(), LimitsError> {
        let mut conn = self.conn.lock();
        let tx = conn.transaction()?;
        for e in events {
            tx.execute(
                "INSERT INTO usage VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    e.account,
                    e.uuid,
                    e.at_ms,
                    e.rows_read.min(i64::MAX as u64) as i64,
                    e.rows_written.min(i64::MAX as u64) as i64
                ],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Rows read and written per account since `since_ms`.
    pub fn totals_since(&self, since_ms: i64) -> Result<Vec<(String, u64, u64)>, LimitsError> {
        let conn = self.conn.lock();
        let mut stmt = conn.prepare(
            "SELECT account, sum(rows_read), sum(rows_written) FROM usage
             WHERE at_ms >= ?1 GROUP BY account",
        )?;
        let rows = stmt
            .query_map([since_ms], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?.max(0) as u64,
                    r.get::<_, i64>(2)?.max(0) as u64,
                ))
            })?
            .collect::<Result<_, _>>()?;
        Ok(rows)
    }
}

/// The limit cache's keys (Quicksilver, standing in): account → expiry.
#[derive(Debug, Default)]
pub struct LimitKeys {
    keys: Mutex<HashMap<String, i64>>,
}

impl LimitKeys {
    pub fn set(&self, account: &str, until_ms: i64) {
        self.keys.lock().insert(account.to_string(), until_ms);
    }

    /// The keys that have not expired.
    pub fn live(&self) -> Vec<Blocked> {
        let now = now_ms();
        let mut keys = self.keys.lock();
        keys.retain(|_, until| *until > now);
        keys.iter()
            .map(|(account, until)| Blocked {
                account: account.clone(),
                until_ms: *until,
            })
            .collect()
    }

    /// Replaces every key with `blocked` (a node's copy).
    pub fn replace(&self, blocked: &[Blocked]) {
        let mut keys = self.keys.lock();
        keys.clear();
        for b in blocked {
            keys.insert(b.account.clone(), b.until_ms);
        }
    }

    /// Whether `account`'s queries are refused now (the query path's
    /// check: memory only).
    pub fn blocked(&self, account: &str) -> bool {
        self.keys
            .lock()
            .get(account)
            .is_some_and(|until| *until > now_ms())
    }
}

/// Finds free-plan accounts over a daily row limit and sets their keys.
#[derive(Debug)]
pub struct Limiter;

impl Limiter {
    /// One pass; returns the accounts newly blocked.
    pub fn run_once(
        analytics: &Analytics,
        catalog: &dyn Catalog,
        keys: &LimitKeys,
    ) -> Result<Vec<String>, LimitsError> {
        let (start, end) = day_bounds_ms(now_ms());
        let mut newly = Vec::new();
        for (account, read, written) in analytics.totals_since(start)? {
            let Ok(id) = AccountId::new(&account) else {
                continue;
            };
            let limits: AccountLimits = catalog.account(&id)?;
            if limits.plan != Plan::Free {
                continue;
            }
            if (read > limits.max_rows_read_per_day || written > limits.max_rows_written_per_day)
                && !keys.blocked(&account)
            {
                tracing::warn!(%account, read, written, "account over its daily row limit: blocked until the end of the day");
                keys.set(&account, end);
                newly.push(account);
            }
        }
        Ok(newly)
    }
}
