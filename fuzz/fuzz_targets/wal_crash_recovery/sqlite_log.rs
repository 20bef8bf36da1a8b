//! SQLite's own error log (`SQLITE_CONFIG_LOG`), kept per execution, so
//! that a failed open reports which system call failed and its errno
//! (os_unix.c logs them), not only "disk I/O error".

use std::collections::VecDeque;
use std::sync::{Mutex, Once};

/// The newest messages of the current execution.
const KEPT: usize = 32;

static LOG: Mutex<VecDeque<String>> = Mutex::new(VecDeque::new());

fn record(code: std::ffi::c_int, msg: &str) {
    let mut log = LOG.lock().unwrap_or_else(|p| p.into_inner());
    if log.len() == KEPT {
        log.pop_front();
    }
    log.push_back(format!("({code}) {msg}"));
}

/// Installs the log callback once, before SQLite is initialised (the first
/// call of the target, ahead of building the base states).
pub(crate) fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: called once, before any connection is opened or the VFS
        // registered in this process, so SQLite is not yet initialised
        // and no other thread is using it; `record` never panics across
        // the C boundary (rusqlite catches unwinds in its trampoline).
        unsafe { rusqlite::trace::config_log(Some(record)) }
            .expect("SQLITE_CONFIG_LOG before initialisation");
    });
}

/// Forgets the previous execution's messages.
pub(crate) fn clear() {
    LOG.lock().unwrap_or_else(|p| p.into_inner()).clear();
}

/// This execution's messages, one per line.
pub(crate) fn recent() -> String {
    let log = LOG.lock().unwrap_or_else(|p| p.into_inner());
    log.iter().map(|m| format!("  sqlite log: {m}\n")).collect()
}

/// The errno of the last failed system call on `c`'s connection.
pub(crate) fn system_errno(c: &rusqlite::Connection) -> i32 {
    // SAFETY: the handle is the live connection `c` owns, used on this
    // thread only; sqlite3_system_errno only reads its last errno.
    unsafe { rusqlite::ffi::sqlite3_system_errno(c.handle()) }
}
