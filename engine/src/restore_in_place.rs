//! Time travel's restore: the primary's database made equal to an older
//! version of itself as one new transaction, which replicas follow like
//! any other and which can itself be undone by restoring the bookmark
//! before it.

use crate::database::Database;
use crate::error::QueryError;
use rusqlite::{Connection, OpenFlags};
use std::path::Path;
use walrelay_replicator::Bookmark;

impl Database {
    /// Replaces the database's content with the SQLite file at `image`
    /// (same page size) in one transaction, through SQLite's backup API
    /// on the writer: every page is written through the capturing VFS, so
    /// the transaction is shipped, confirmed and revealed like any write.
    /// Returns its bookmark once it is confirmed (the output gate).
    pub fn restore_in_place(&self, image: &Path) -> Result<Bookmark, QueryError> {
        let Some(p) = self.primary() else {
            return Err(QueryError::ReadOnlyReplica);
        };
        self.check_capture()?;
        p.gate_admit()?;
        let src = Connection::open_with_flags(
            image,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(QueryError::sql)?;
        let mut w = p.writer.lock();
        crate::sandbox::reset_if_dirty(&w.conn).map_err(QueryError::sql)?;
        let copied = {
            let backup =
                rusqlite::backup::Backup::new(&src, &mut w.conn.conn).map_err(QueryError::sql)?;
            // -1: every page in one step, so one transaction.
            backup
                .step(-1)
                .map_err(QueryError::sql)
                .and_then(|s| match s {
                    rusqlite::backup::StepResult::Done => Ok(()),
                    other => Err(QueryError::sql(rusqlite::Error::SqliteFailure(
                        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
                        Some(format!("restoring: the backup step ended with {other:?}")),
                    ))),
                })
        };
        if let Err(e) = copied {
            let e = self.explain(e);
            drop(w);
            return Err(e);
        }
        self.check_capture()?;
        let bookmark = self.latest_bookmark();
        p.maybe_checkpoint(&w.conn.conn);
        drop(w);
        p.gate_wait(bookmark)?;
        tracing::info!(path = %self.path().display(), %bookmark, "database restored in place");
        Ok(bookmark)
    }
}
