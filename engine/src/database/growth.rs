//! Freezing a primary's size: the storage limit of an account that is
//! over it (the fleet's heartbeat says so) refuses writes that would grow
//! the database, and nothing else.
//!
//! The writer's `max_page_count` is set to the database's current page
//! count: SQLite then fails any write that needs a new page with
//! SQLITE_FULL (answered as [`QueryError::StorageLimit`]), while writes
//! that reuse free pages or shrink the database go through. Thawing puts
//! back the configured size limit.

use super::{Database, Role};
use crate::error::QueryError;
use std::sync::atomic::Ordering;

impl Database {
    /// Refuses (or again allows) writes that would grow this primary.
    /// Idempotent; a replica has nothing to freeze.
    pub fn freeze_growth(&self, frozen: bool) -> Result<(), QueryError> {
        let Role::Primary(p) = &self.inner.role else {
            return Ok(());
        };
        if p.growth_frozen.load(Ordering::SeqCst) == frozen {
            return Ok(());
        }
        let w = p.writer.lock();
        let limits = &self.inner.limits;
        crate::sandbox::as_engine(&w.conn, |conn| {
            let pages: u32 = if frozen {
                conn.query_row("PRAGMA page_count", [], |r| r.get(0))?
            } else {
                crate::sandbox::max_pages(conn, limits)?
            };
            conn.execute_batch(&format!("PRAGMA max_page_count={pages};"))
        })
        .map_err(QueryError::sql)?;
        p.growth_frozen.store(frozen, Ordering::SeqCst);
        tracing::info!(path = %self.inner.path.display(), frozen, "database growth limit changed");
        Ok(())
    }

    /// Whether writes that would grow this database are refused.
    pub fn growth_frozen(&self) -> bool {
        match &self.inner.role {
            Role::Primary(p) => p.growth_frozen.load(Ordering::SeqCst),
            Role::Replica(_) => false,
        }
    }
}
