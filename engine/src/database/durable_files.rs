//! The database's own files made whole: a byte image for a snapshot, and
//! an fsync of the database and its WAL before a clean stop.

use super::{CheckpointMode, Database, checkpoint_on};
use crate::error::CheckpointError;
use rusqlite::ffi;
use std::time::{Duration, Instant};
use walrelay_replicator::Bookmark;

impl Database {
    /// The whole database as one byte image, page for page, and the
    /// bookmark it stands for: writes are paused, a TRUNCATE checkpoint
    /// moves every frame into the database file, and the file is read
    /// through the writer connection's own SQLite file object (opening
    /// another descriptor would drop this process's POSIX locks on it).
    pub(crate) fn snapshot_image(&self) -> Result<(Vec<u8>, Bookmark), CheckpointError> {
        let Some(p) = self.primary() else {
            return Err(CheckpointError::Sqlite {
                code: ffi::SQLITE_MISUSE,
            });
        };
        let w = p.writer.lock();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match checkpoint_on(&w.conn.conn, CheckpointMode::Truncate) {
                Ok(_) => break,
                Err(CheckpointError::Busy) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(e),
            }
        }
        let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
        // SAFETY: the writer connection is live and held exclusively;
        // FILE_POINTER stores a pointer to its main database file.
        let rc = unsafe {
            ffi::sqlite3_file_control(
                w.conn.conn.handle(),
                c"main".as_ptr(),
                ffi::SQLITE_FCNTL_FILE_POINTER,
                (&raw mut file).cast(),
            )
        };
        if rc != ffi::SQLITE_OK || file.is_null() {
            return Err(CheckpointError::Sqlite { code: rc });
        }
        let mut size: ffi::sqlite3_int64 = 0;
        // SAFETY: `file` is the open main-db file of the held connection;
        // xFileSize writes one integer, xRead fills exactly the buffer it is
        // given (zero-filling past the end, which cannot happen here).
        let image = unsafe {
            let m = &*(*file).pMethods;
            let (Some(file_size), Some(read)) = (m.xFileSize, m.xRead) else {
                return Err(CheckpointError::Sqlite {
                    code: ffi::SQLITE_MISUSE,
                });
            };
            let rc = file_size(file, &mut size);
            if rc != ffi::SQLITE_OK {
                return Err(CheckpointError::Sqlite { code: rc });
            }
            let mut image = vec![0u8; size.max(0) as usize];
            for (i, chunk) in image.chunks_mut(1 << 20).enumerate() {
                let off = (i as ffi::sqlite3_int64) << 20;
                let rc = read(file, chunk.as_mut_ptr().cast(), chunk.len() as i32, off);
                if rc != ffi::SQLITE_OK {
                    return Err(CheckpointError::Sqlite { code: rc });
                }
            }
            image
        };
        Ok((image, self.latest_bookmark()))
    }
}

impl Database {
    /// Makes the database file and its WAL durable (fsync both), through
    /// the writer connection's own file objects while holding the writer
    /// (no commit in flight). A replicated primary runs `synchronous=OFF`,
    /// so before it claims a clean stop its local files must hold, on
    /// stable storage, everything the marker says they hold.
    pub(crate) fn sync_files(&self) -> Result<(), CheckpointError> {
        let Some(p) = self.primary() else {
            return Ok(());
        };
        let w = p.writer.lock();
        for op in [
            ffi::SQLITE_FCNTL_FILE_POINTER,
            ffi::SQLITE_FCNTL_JOURNAL_POINTER,
        ] {
            let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
            // SAFETY: the writer connection is live and held exclusively;
            // these file controls store a pointer to its main database file
            // or its WAL file (null if the WAL is not open).
            let rc = unsafe {
                ffi::sqlite3_file_control(
                    w.conn.conn.handle(),
                    c"main".as_ptr(),
                    op,
                    (&raw mut file).cast(),
                )
            };
            if rc != ffi::SQLITE_OK {
                return Err(CheckpointError::Sqlite { code: rc });
            }
            if file.is_null() || is_unopened(file) {
                continue;
            }
            // SAFETY: `file` is an open file of the held connection with
            // io methods (checked above); xSync takes only the flags.
            let rc = unsafe {
                match (*(*file).pMethods).xSync {
                    Some(sync) => sync(file, ffi::SQLITE_SYNC_NORMAL),
                    None => ffi::SQLITE_OK,
                }
            };
            if rc != ffi::SQLITE_OK {
                return Err(CheckpointError::Sqlite { code: rc });
            }
        }
        Ok(())
    }

    /// Successful fsyncs so far of this primary's database file and WAL
    /// (None on a replica).
    pub fn file_syncs(&self) -> Option<(u64, u64)> {
        self.primary().map(|p| p.attachment.syncs())
    }

    /// Runs `check` while holding the writer lock (no commit in flight);
    /// a replica just runs it.
    pub(crate) fn quiesce(&self, check: impl FnOnce() -> bool) -> bool {
        match self.primary() {
            Some(p) => {
                let _w = p.writer.lock();
                check()
            }
            None => check(),
        }
    }
}

/// Whether an SQLite file object has no io methods (a file that was never
/// opened); such a file has nothing to sync.
fn is_unopened(file: *mut ffi::sqlite3_file) -> bool {
    // SAFETY: `file` is non-null and was handed out by SQLite for a live
    // connection; reading its methods pointer is how SQLite itself tests
    // whether it is open.
    unsafe { (*file).pMethods.is_null() }
}
