//! A connection's raw handle as a callback installed on that connection
//! keeps it (an address, so the callback stays `Send`), and the one
//! question such callbacks ask of SQLite through it.

use rusqlite::{Connection, ffi};

/// The raw handle of the connection a callback (the authorizer, the
/// progress handler) is installed on.
#[derive(Clone, Copy)]
pub(crate) struct Handle(usize);

impl Handle {
    /// The handle of `conn`, for a callback that `conn` will own: the
    /// callback is dropped with the connection, so it only ever uses the
    /// handle while the connection is open.
    pub(crate) fn of(conn: &Connection) -> Handle {
        // SAFETY: only the handle's address is read here.
        Handle(unsafe { conn.handle() } as usize)
    }

    /// Whether a statement of this connection is part way through running
    /// (stepped, neither done nor reset). A statement that has halted is
    /// not: SQLite calls the progress handler once more after `OP_Halt`,
    /// which commits an autocommit statement.
    pub(crate) fn statement_running(self) -> bool {
        let db = self.0 as *mut ffi::sqlite3;
        // SAFETY: the handle belongs to the connection that owns the
        // calling callback, which SQLite only calls while that connection
        // is in use on this thread, so the handle is live and not used
        // concurrently; next_stmt and stmt_busy only read the connection's
        // statement list (under its own recursive mutex, if it has one).
        unsafe {
            let mut s = ffi::sqlite3_next_stmt(db, std::ptr::null_mut());
            while !s.is_null() {
                if ffi::sqlite3_stmt_busy(s) != 0 {
                    return true;
                }
                s = ffi::sqlite3_next_stmt(db, s);
            }
        }
        false
    }
}
