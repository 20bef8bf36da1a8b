//! One process at a time on a database's files.
//!
//! Attaching a database takes an exclusive, non-blocking `flock` on a
//! sidecar file next to it (`<db>-walrelay-lock`, empty) and holds it
//! while the [`crate::Attachment`] lives. A second process that attaches
//! the same database (a second primary or replica started on the same
//! directory) is refused before it touches any file: a replica's open cuts
//! its WAL back to the watermark and a primary's moves the epoch on disk,
//! either of which would damage the process already running there.
//!
//! Within a process the lock is shared: every [`OwnerLock`] of one
//! database is a handle on the same locked file, released when the last
//! is dropped. So a node can take it before it does anything else (a
//! primary before its election, which would otherwise fence the primary
//! already running there) and attach the database under it later.
//!
//! `flock` belongs to the open file, not to the process, so closing some
//! other descriptor of the database (which drops every POSIX lock the
//! process holds on it) leaves this one in place. SQLite's own locks
//! still keep other SQLite processes out: the VFS wraps `unix-excl`
//! (see [`crate::shim`]).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Weak};

/// The locks this process holds, by lock file (its directory resolved).
static HELD: LazyLock<Mutex<HashMap<PathBuf, Weak<Held>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// One locked lock file.
#[derive(Debug)]
struct Held {
    file: File,
    path: PathBuf,
    /// This hold made the file: it goes again unless [`OwnerLock::keep`]
    /// is called, so a refused open (not a database, say) leaves the
    /// directory as it found it.
    created: bool,
    keep: AtomicBool,
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.created && !self.keep.load(Ordering::Acquire) {
            // Still locked while it is unlinked: nobody holds it meanwhile.
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// How long [`OwnerLock::acquire`] retries a lock that looks taken (see
/// there): a fork-to-exec window, even on a loaded machine.
pub const INHERITED_HOLD_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The lock file's suffix, after the database's own name.
pub const LOCK_SUFFIX: &str = "-walrelay-lock";

/// Why a database's files could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum OwnerLockError {
    #[error("{db} is in use by another process (it holds {lock})")]
    InUse { db: PathBuf, lock: PathBuf },
    #[error("cannot lock {lock}: {source}")]
    Io {
        lock: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A handle on the held lock; the lock is released when the last handle
/// of the process is dropped (the file is closed).
#[derive(Debug, Clone)]
pub struct OwnerLock {
    held: Arc<Held>,
}

/// The lock file of the database at `db`.
pub fn lock_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(LOCK_SUFFIX);
    PathBuf::from(name)
}

impl OwnerLock {
    /// Takes the database's lock, or shares this process's hold of it, or
    /// says that another process has it. Waits only while the lock looks
    /// taken, and at most [`INHERITED_HOLD_WAIT`]: a child this process
    /// is starting holds a copy of every descriptor from its fork until
    /// its exec closes them (close-on-exec), this lock's included, so a
    /// hold this process has just released can still be held for that
    /// moment.
    pub fn acquire(db: &Path) -> Result<OwnerLock, OwnerLockError> {
        let deadline = std::time::Instant::now() + INHERITED_HOLD_WAIT;
        loop {
            match Self::try_acquire(db) {
                Err(OwnerLockError::InUse { .. }) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                r => return r,
            }
        }
    }

    /// One attempt of [`Self::acquire`].
    fn try_acquire(db: &Path) -> Result<OwnerLock, OwnerLockError> {
        let lock = lock_path(db);
        let io = |source| OwnerLockError::Io {
            lock: lock.clone(),
            source,
        };
        // One key per file however the path is spelled: the directory
        // resolved (it exists; the lock file may not yet).
        let key = match (lock.parent(), lock.file_name()) {
            (Some(dir), Some(name)) => {
                let dir = if dir.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    dir
                };
                std::fs::canonicalize(dir).map_err(io)?.join(name)
            }
            _ => lock.clone(),
        };
        let mut held = HELD.lock();
        if let Some(h) = held.get(&key).and_then(Weak::upgrade) {
            return Ok(OwnerLock { held: h });
        }
        let mut open = OpenOptions::new();
        open.read(true).write(true);
        let (file, created) = match open.clone().create_new(true).open(&lock) {
            Ok(f) => (f, true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                (open.open(&lock).map_err(io)?, false)
            }
            Err(e) => return Err(io(e)),
        };
        let h = Held {
            file,
            path: lock.clone(),
            created,
            keep: AtomicBool::new(false),
        };
        match try_flock(&h.file) {
            Ok(true) => {
                let h = Arc::new(h);
                held.retain(|_, w| w.strong_count() > 0);
                held.insert(key, Arc::downgrade(&h));
                Ok(OwnerLock { held: h })
            }
            Ok(false) => {
                // Made here but locked by another open before this one
                // could lock it: that holder's file, never removed.
                h.keep.store(true, Ordering::Release);
                Err(OwnerLockError::InUse {
                    db: db.to_path_buf(),
                    lock,
                })
            }
            Err(e) => Err(io(e)),
        }
    }

    /// The database opened: its lock file stays after the lock is
    /// released, like the database's other files.
    pub fn keep(&self) {
        self.held.keep.store(true, Ordering::Release);
    }
}

/// An exclusive `flock` on `file` if free now: `Ok(false)` if another
/// open file holds it.
fn try_flock(file: &File) -> std::io::Result<bool> {
    // SAFETY: flock(2) on a descriptor `file` owns and keeps open for the
    // call; it touches no memory of ours.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EWOULDBLOCK) => Ok(false),
        _ => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_shares_its_hold_and_another_open_file_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let db = dir.path().join("db.sqlite");
        let first = OwnerLock::acquire(&db).expect("first");
        // The same process, however the path is spelled: one hold.
        let spelled = dir.path().join(".").join("db.sqlite");
        let second = OwnerLock::acquire(&spelled).expect("shared in this process");
        // Another open file of the lock, as another process has.
        let other = OpenOptions::new()
            .write(true)
            .open(lock_path(&db))
            .expect("lock file");
        assert!(!try_flock(&other).expect("flock"));
        drop(first);
        assert!(
            !try_flock(&other).expect("flock"),
            "held while a handle lives"
        );
        drop(second);
        assert!(
            try_flock(&other).expect("flock"),
            "free once the last handle is gone"
        );
    }

    #[test]
    fn a_hold_released_within_the_inherited_hold_wait_is_waited_for_and_a_longer_one_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let db = dir.path().join("db.sqlite");
        // Another open file holding the lock, as a child between its fork
        // and its exec holds this process's: released after 100 ms.
        let other = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(lock_path(&db))
            .expect("lock file");
        assert!(try_flock(&other).expect("flock"));
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            drop(other);
        });
        let l = OwnerLock::acquire(&db).expect("waited for the brief hold");
        releaser.join().expect("releaser");

        // Held for good by another open file: refused once the wait is up.
        let held = OpenOptions::new()
            .write(true)
            .open(lock_path(&db))
            .expect("lock file");
        drop(l);
        assert!(try_flock(&held).expect("flock"));
        let t = std::time::Instant::now();
        assert!(matches!(
            OwnerLock::acquire(&db),
            Err(OwnerLockError::InUse { .. })
        ));
        assert!(t.elapsed() >= INHERITED_HOLD_WAIT);
    }

    #[test]
    fn a_lock_file_made_for_an_open_that_failed_goes_and_a_kept_one_stays() {
        let dir = tempfile::tempdir().expect("dir");
        let db = dir.path().join("db.sqlite");
        drop(OwnerLock::acquire(&db).expect("lock"));
        assert!(!lock_path(&db).exists(), "never kept: gone");
        let l = OwnerLock::acquire(&db).expect("lock");
        l.keep();
        drop(l);
        assert!(lock_path(&db).exists(), "kept");
        // One that was there already is never removed.
        drop(OwnerLock::acquire(&db).expect("lock"));
        assert!(lock_path(&db).exists());
    }
}
