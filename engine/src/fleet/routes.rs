//! A node's routing table: where each database lives (D1's Workers KV).
//!
//! Every node keeps one, persistent and eventually consistent. The query
//! path reads it (from memory) and nothing else; it never asks the
//! catalog. Each database is the single writer of its own entry: its host
//! writes the entry on activation and rewrites it on every heartbeat that
//! finds it missing or stale, on every node ([`super::heartbeat`]), and
//! removes it on deletion. A stale entry can therefore lead a query to the
//! wrong node or to a deleted database, and the database itself turns it
//! away.
//!
//! On disk: a SQLite file of its own (`routes.db`, not replicated: each
//! node's copy is written by the databases' hosts), loaded into memory at
//! start. One row per database:
//!
//! ```text
//! routes(uuid TEXT PK, database_id INTEGER, account TEXT, name TEXT,
//!        node TEXT, written_at_ms INTEGER)
//! ```

use super::names::{AccountId, DatabaseName, DatabaseUuid};
use parking_lot::{Mutex, RwLock};
use rusqlite::{Connection, params};
use std::collections::HashMap;
use std::path::Path;
use walrelay_replicator::DatabaseId;

/// One database's routing entry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Route {
    pub uuid: String,
    pub database_id: u64,
    pub account: String,
    pub name: String,
    /// The HTTP base URL of the node hosting its primary.
    pub node: String,
    pub written_at_ms: i64,
}

impl Route {
    /// The entry's ids, checked (an entry is input from another node).
    pub fn parsed(
        &self,
    ) -> Result<(DatabaseUuid, DatabaseId, AccountId, DatabaseName), RouteError> {
        let bad = |what: String| RouteError::Malformed(what);
        Ok((
            self.uuid.parse().map_err(|e| bad(format!("{e}")))?,
            DatabaseId(self.database_id),
            AccountId::new(&self.account).map_err(|e| bad(e.to_string()))?,
            DatabaseName::new(&self.name).map_err(|e| bad(e.to_string()))?,
        ))
    }
}

/// Why the routing table refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("a malformed routing entry: {0}")]
    Malformed(String),
    #[error("the routing table's storage failed: {0}")]
    Storage(#[from] rusqlite::Error),
}

#[derive(Debug, Default)]
struct Maps {
    by_uuid: HashMap<DatabaseUuid, Route>,
    by_name: HashMap<(AccountId, DatabaseName), DatabaseUuid>,
}

impl Maps {
    fn insert(&mut self, route: Route) -> Result<(), RouteError> {
        let (uuid, _, account, name) = route.parsed()?;
        if let Some(old) = self.by_uuid.remove(&uuid) {
            if let Ok((_, _, a, n)) = old.parsed() {
                self.by_name.remove(&(a, n));
            }
        }
        self.by_name.insert((account, name), uuid);
        self.by_uuid.insert(uuid, route);
        Ok(())
    }
    fn remove(&mut self, uuid: DatabaseUuid) -> Option<Route> {
        let old = self.by_uuid.remove(&uuid)?;
        if let Ok((_, _, a, n)) = old.parsed() {
            if self.by_name.get(&(a.clone(), n.clone())) == Some(&uuid) {
                self.by_name.remove(&(a, n));
            }
        }
        Some(old)
    }
}

/// A change this node's databases made to their own entries, to be sent
/// to every other node's table.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum RouteChange {
    Put { route: Route },
    Remove { uuid: String, database_id: u64 },
}

/// Most changes waiting to be sent; past it the oldest are dropped (the
/// next heartbeat of their database sends them again).
pub const MAX_OUTBOX: usize = 100_000;

/// The routing table.
#[derive(Debug)]
pub struct Routes {
    maps: RwLock<Maps>,
    conn: Mutex<Connection>,
    outbox: Mutex<std::collections::VecDeque<RouteChange>>,
}

impl Routes {
    /// Opens (or creates) the table at `path` and loads it.
    pub fn open(path: &Path) -> Result<Routes, RouteError> {
        let conn = Connection::open(path)?;
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;
             CREATE TABLE IF NOT EXISTS routes(uuid TEXT PRIMARY KEY, database_id INTEGER NOT NULL,
                account TEXT NOT NULL, name TEXT NOT NULL, node TEXT NOT NULL,
                written_at_ms INTEGER NOT NULL);",
        )?;
        let mut maps = Maps::default();
        {
            let mut stmt = conn.prepare(
                "SELECT uuid, database_id, account, name, node, written_at_ms FROM routes",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok(Route {
                    uuid: r.get(0)?,
                    database_id: r.get::<_, i64>(1)? as u64,
                    account: r.get(2)?,
                    name: r.get(3)?,
                    node: r.get(4)?,
                    written_at_ms: r.get(5)?,
                })
            })?;
            for route in rows {
                let route = route?;
                if let Err(e) = maps.insert(route) {
                    tracing::warn!(error = %e, "skipping a malformed stored route");
                }
            }
        }
        Ok(Routes {
            maps: RwLock::new(maps),
            conn: Mutex::new(conn),
            outbox: Mutex::new(std::collections::VecDeque::new()),
        })
    }

    /// The entry for `uuid` (memory only: the query path's lookup).
    pub fn get(&self, uuid: DatabaseUuid) -> Option<Route> {
        self.maps.read().by_uuid.get(&uuid).cloned()
    }

    /// The entry for an account's database name (memory only).
    pub fn by_name(&self, account: &AccountId, name: &DatabaseName) -> Option<Route> {
        let maps = self.maps.read();
        let uuid = maps.by_name.get(&(account.clone(), name.clone()))?;
        maps.by_uuid.get(uuid).cloned()
    }

    /// Writes an entry (replacing that database's previous one).
    pub fn put(&self, route: Route) -> Result<(), RouteError> {
        route.parsed()?;
        {
            let conn = self.conn.lock();
            conn.execute(
                "INSERT INTO routes VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT(uuid) DO UPDATE SET database_id = excluded.database_id,
                   account = excluded.account, name = excluded.name, node = excluded.node,
                   written_at_ms = excluded.written_at_ms",
                params![
                    route.uuid,
                    route.database_id as i64,
                    route.account,
                    route.name,
                    route.node,
                    route.written_at_ms
                ],
            )?;
        }
        self.maps.write().insert(route)
    }

    /// Removes `uuid`'s entry if it still names `database_id` (a later
    /// database's entry is not removed by an older one's deletion).
    pub fn remove(&self, uuid: DatabaseUuid, database_id: DatabaseId) -> Result<bool, RouteError> {
        let mut maps = self.maps.write();
        match maps.by_uuid.get(&uuid) {
            Some(r) if r.database_id == database_id.0 => {}
            _ => return Ok(false),
        }
        self.conn.lock().execute(
            "DELETE FROM routes WHERE uuid = ?1 AND database_id = ?2",
            params![uuid.to_string(), database_id.0 as i64],
        )?;
        Ok(maps.remove(uuid).is_some())
    }

    /// Writes a hosted database's own entry here and queues it for every
    /// other node (sent again even if unchanged: that is how a heartbeat
    /// repairs the other nodes' copies).
    pub fn publish(&self, route: Route) -> Result<(), RouteError> {
        let unchanged = self
            .get(route.parsed()?.0)
            .is_some_and(|r| same_target(&r, &route));
        if !unchanged {
            self.put(route.clone())?;
        }
        self.queue(RouteChange::Put { route });
        Ok(())
    }

    /// Removes a hosted database's own entry here and on every other node.
    pub fn unpublish(&self, uuid: DatabaseUuid, database_id: DatabaseId) -> Result<(), RouteError> {
        self.remove(uuid, database_id)?;
        self.queue(RouteChange::Remove {
            uuid: uuid.to_string(),
            database_id: database_id.0,
        });
        Ok(())
    }

    fn queue(&self, change: RouteChange) {
        let mut outbox = self.outbox.lock();
        if outbox.len() >= MAX_OUTBOX {
            outbox.pop_front();
        }
        outbox.push_back(change);
    }

    /// The changes waiting to be sent, taken.
    pub fn take_outbox(&self) -> Vec<RouteChange> {
        self.outbox.lock().drain(..).collect()
    }

    /// Applies changes another node's databases made; returns how many
    /// changed this table.
    pub fn apply(&self, changes: &[RouteChange]) -> Result<usize, RouteError> {
        let mut changed = 0;
        for c in changes {
            match c {
                RouteChange::Put { route } => {
                    let uuid = route.parsed()?.0;
                    if !self.get(uuid).is_some_and(|r| same_target(&r, route)) {
                        self.put(route.clone())?;
                        changed += 1;
                    }
                }
                RouteChange::Remove { uuid, database_id } => {
                    let uuid: DatabaseUuid =
                        uuid.parse().map_err(|e: super::names::UuidParseError| {
                            RouteError::Malformed(e.to_string())
                        })?;
                    if self.remove(uuid, DatabaseId(*database_id))? {
                        changed += 1;
                    }
                }
            }
        }
        Ok(changed)
    }

    /// Entries held.
    /// Every database id with an entry.
    pub fn database_ids(&self) -> std::collections::HashSet<DatabaseId> {
        self.maps
            .read()
            .by_uuid
            .values()
            .map(|r| DatabaseId(r.database_id))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.maps.read().by_uuid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether two entries send a query to the same place.
fn same_target(a: &Route, b: &Route) -> bool {
    a.uuid == b.uuid
        && a.database_id == b.database_id
        && a.node == b.node
        && a.account == b.account
        && a.name == b.name
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(uuid: DatabaseUuid, id: u64, name: &str, node: &str) -> Route {
        Route {
            uuid: uuid.to_string(),
            database_id: id,
            account: "acct".into(),
            name: name.into(),
            node: node.into(),
            written_at_ms: 1,
        }
    }

    #[test]
    fn entries_survive_a_reopen_and_resolve_by_uuid_and_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("routes.db");
        let u = DatabaseUuid::random();
        {
            let r = Routes::open(&path).unwrap();
            r.put(route(u, 7, "a", "http://n1")).unwrap();
            r.put(route(u, 7, "a", "http://n2")).unwrap();
        }
        let r = Routes::open(&path).unwrap();
        assert_eq!(r.get(u).unwrap().node, "http://n2");
        let acct = AccountId::new("acct").unwrap();
        let name = DatabaseName::new("a").unwrap();
        assert_eq!(r.by_name(&acct, &name).unwrap().database_id, 7);
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn removal_by_an_older_database_leaves_a_newer_entry() {
        let dir = tempfile::tempdir().unwrap();
        let r = Routes::open(&dir.path().join("routes.db")).unwrap();
        let u = DatabaseUuid::random();
        r.put(route(u, 8, "a", "http://n1")).unwrap();
        assert!(!r.remove(u, DatabaseId(7)).unwrap());
        assert!(r.get(u).is_some());
        assert!(r.remove(u, DatabaseId(8)).unwrap());
        assert!(r.get(u).is_none());
    }

    #[test]
    fn a_malformed_entry_is_refused_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let r = Routes::open(&dir.path().join("routes.db")).unwrap();
        let mut bad = route(DatabaseUuid::random(), 1, "a", "http://n1");
        bad.name = "Not A Name".into();
        assert!(matches!(r.put(bad), Err(RouteError::Malformed(_))));
        assert!(r.is_empty());
    }
}
