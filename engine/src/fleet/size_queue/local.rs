//! The local size queue: a SQLite file on the control plane's node.
//!
//! ```text
//! sizes(id INTEGER PRIMARY KEY, uuid TEXT, account TEXT, size_bytes INTEGER)
//! ```

use super::{MAX_QUEUE_ENTRIES, SizeQueue, Taken};
use crate::fleet::limits::{LimitsError, SizeReport};
use parking_lot::Mutex;
use rusqlite::{Connection, params};
use std::path::Path;

/// The local queue: a SQLite file on the control plane's node.
#[derive(Debug)]
pub struct LocalSizeQueue {
    conn: Mutex<Connection>,
}

impl LocalSizeQueue {
    pub fn open(path: &Path) -> Result<LocalSizeQueue, LimitsError> {
        Ok(LocalSizeQueue {
            conn: Mutex::new(super::super::limits::open_sqlite(
                path,
                "CREATE TABLE IF NOT EXISTS sizes(id INTEGER PRIMARY KEY, uuid TEXT NOT NULL,
                    account TEXT NOT NULL, size_bytes INTEGER NOT NULL);",
            )?),
        })
    }
}

impl SizeQueue for LocalSizeQueue {
    fn push(&self, reports: &[SizeReport]) -> Result<usize, LimitsError> {
        let mut conn = self.conn.lock();
        let held: i64 = conn.query_row("SELECT count(*) FROM sizes", [], |r| r.get(0))?;
        let held = held.max(0) as u64;
        let room = MAX_QUEUE_ENTRIES.saturating_sub(held) as usize;
        let tx = conn.transaction()?;
        for r in reports.iter().take(room) {
            tx.execute(
                "INSERT INTO sizes(uuid, account, size_bytes) VALUES (?1, ?2, ?3)",
                params![r.uuid, r.account, r.size_bytes.min(i64::MAX as u64) as i64],
            )?;
        }
        tx.commit()?;
        if reports.len() > room {
            tracing::warn!(dropped = reports.len() - room, "the size queue is full");
        }
        Ok(reports.len().min(room))
    }

    /// Removes what it hands out: a consumer that fails to write a batch
    /// loses nothing that matters, as every size is sent again when it
    /// changes and the newest wins.
    fn take(&self, max: usize) -> Result<Taken, LimitsError> {
        let mut conn = self.conn.lock();
        let tx = conn.transaction()?;
        let rows: Vec<(i64, String, String, i64)> = {
            let mut stmt =
                tx.prepare("SELECT id, uuid, account, size_bytes FROM sizes ORDER BY id LIMIT ?1")?;
            stmt.query_map([max as i64], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?
            .collect::<Result<_, _>>()?
        };
        if let Some(last) = rows.last() {
            tx.execute("DELETE FROM sizes WHERE id <= ?1", [last.0])?;
        }
        tx.commit()?;
        Ok(Taken {
            reports: rows
                .into_iter()
                .map(|(_, uuid, account, size)| SizeReport {
                    uuid,
                    account,
                    size_bytes: size.max(0) as u64,
                })
                .collect(),
            ids: Vec::new(),
        })
    }

    fn ack(&self, _taken: &Taken) -> Result<(), LimitsError> {
        Ok(())
    }

    fn len(&self) -> Result<u64, LimitsError> {
        let n: i64 = self
            .conn
            .lock()
            .query_row("SELECT count(*) FROM sizes", [], |r| r.get(0))?;
        Ok(n.max(0) as u64)
    }
}
