//! Which databases the VFS captures, and where their transactions go.
//!
//! A database must be attached (path → sink) before SQLite opens it through
//! the walrelay VFS; opening an unattached database is refused, so that no
//! connection can write a walrelay database without being captured.

use crate::capture::{Capture, CaptureError, CaptureStats, WalReader};
use crate::page_set::CapturedTransaction;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};

/// Receives every committed transaction of an attached database.
///
/// Called on the committing thread while SQLite still holds the WAL write
/// lock, so calls arrive in commit order and never concurrently for one
/// database. It must not call back into SQLite on that connection, and
/// should be quick: the next writer waits for it.
pub trait CaptureSink: Send + Sync {
    fn committed(&self, txn: CapturedTransaction) -> Result<(), SinkError>;
}

/// A sink's refusal of a transaction. The transaction is already in the
/// local WAL; the refusal poisons the capture so that the engine fails the
/// write and takes no further ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SinkError(pub String);

/// Why a database could not be attached.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("database {0} is already attached to walrelay in this process")]
    AlreadyAttached(String),
    #[error("cannot resolve database path {path}: {reason}")]
    Path { path: PathBuf, reason: String },
    #[error("could not register the walrelay VFS: SQLite error code {0}")]
    Register(i32),
    /// Another process has the database (or its lock could not be taken).
    #[error(transparent)]
    Owner(#[from] crate::owner_lock::OwnerLockError),
}

/// Reads the WAL through its own descriptor; opened on first need, which is
/// only the rare path where the shadow lacks bytes.
#[derive(Debug, Default)]
pub(crate) struct WalFile {
    path: OnceLock<PathBuf>,
    file: OnceLock<File>,
}

impl WalFile {
    pub(crate) fn set_path(&self, path: PathBuf) {
        let _ = self.path.set(path);
    }
}

impl WalReader for WalFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let file = match self.file.get() {
            Some(f) => f,
            None => {
                let path = self.path.get().ok_or(std::io::ErrorKind::NotFound)?;
                let f = File::open(path)?;
                self.file.get_or_init(|| f)
            }
        };
        file.read_exact_at(buf, offset)
    }
}

/// State shared by every file SQLite opens for one attached database.
pub(crate) struct DbShared {
    pub(crate) key: String,
    /// `None` for a replica: its WAL is written by the applier alone and
    /// SQLite connections may only read.
    pub(crate) sink: Option<Arc<dyn CaptureSink>>,
    pub(crate) capture: Mutex<Capture>,
    pub(crate) wal: WalFile,
    /// Where the hold's run of frames not yet in the WAL file starts
    /// (`u64::MAX`: none), set under the capture's lock: a read of the WAL
    /// below it needs nothing written first, and every reader of published
    /// frames reads below it (see `write_behind`).
    run_from: AtomicU64,
    /// True from the moment a commit frame is written until its transaction
    /// has been handed to the sink: the window in which a reader may see a
    /// transaction that has no bookmark yet.
    in_flight: AtomicBool,
    /// Readers blocked in `wait_commit_settled`: the settler takes the lock
    /// and notifies only when there are any.
    waiters: AtomicUsize,
    /// Successful syncs of the database file and of its WAL.
    db_syncs: AtomicU64,
    wal_syncs: AtomicU64,
    /// Fault injection for tests: the next WAL sync fails.
    fail_next_wal_sync: AtomicBool,
    settle_lock: Mutex<()>,
    settled: Condvar,
}

impl std::fmt::Debug for DbShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbShared")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl DbShared {
    pub(crate) fn is_replica(&self) -> bool {
        self.sink.is_none()
    }

    /// Whether this WAL sync must fail (fault injection; once).
    pub(crate) fn take_injected_wal_sync_failure(&self) -> bool {
        self.fail_next_wal_sync.swap(false, Ordering::SeqCst)
    }

    pub(crate) fn count_sync(&self, wal: bool) {
        let counter = if wal { &self.wal_syncs } else { &self.db_syncs };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Notes where the capture's run of unwritten frames now starts.
    pub(crate) fn note_run(&self, capture: &Capture) {
        self.run_from
            .store(capture.run_start().unwrap_or(u64::MAX), Ordering::Release);
    }

    /// Whether a read of `len` bytes at `offset` of the WAL reaches frames
    /// kept back from the file.
    pub(crate) fn run_reaches(&self, offset: u64, len: usize) -> bool {
        offset.saturating_add(len as u64) > self.run_from.load(Ordering::Acquire)
    }

    pub(crate) fn mark_in_flight(&self) {
        // No lock needed to raise the flag: waiters re-check it under the
        // lock, and only lowering it must not race their wait.
        self.in_flight.store(true, Ordering::SeqCst);
    }

    pub(crate) fn mark_settled(&self) {
        // SeqCst on both sides (flag then waiters here, waiters then flag in
        // the waiter) means a waiter either sees the flag down or is seen.
        self.in_flight.store(false, Ordering::SeqCst);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            let _g = self.settle_lock.lock();
            self.settled.notify_all();
        }
    }

    /// Ends a hold: captures, hands the transaction to the sink, settles.
    /// `published` is the wal-index header SQLite left as the lock is
    /// released (None if it could not be read).
    pub(crate) fn end_hold(&self, published: Option<crate::wal_index::IndexHeader>) {
        let result = {
            let mut capture = self.capture.lock();
            let result = capture.end_hold(&self.wal, published);
            self.note_run(&capture);
            result
        };
        if let (Ok(Some(txn)), Some(sink)) = (result, &self.sink) {
            let sink = Arc::clone(sink);
            let outcome =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || sink.committed(txn)));
            let err = match outcome {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(CaptureError::Sink(e.0)),
                Err(p) => Some(CaptureError::Panic(panic_message(&p))),
            };
            if let Some(e) = err {
                self.capture.lock().poison_with(e);
            }
        }
        self.mark_settled();
    }
}

pub(crate) fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic".to_string()
    }
}

static REGISTRY: LazyLock<Mutex<HashMap<String, Arc<DbShared>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

pub(crate) fn lookup(key: &str) -> Option<Arc<DbShared>> {
    REGISTRY.lock().get(key).cloned()
}

/// Attaches the database at `path` to the walrelay VFS: from now on every
/// transaction committed to it through the VFS goes to `sink`. Detached when
/// the returned handle drops.
pub fn attach(path: &Path, sink: Arc<dyn CaptureSink>) -> Result<Attachment, AttachError> {
    attach_as(path, Some(sink))
}

/// Attaches a replica database: SQLite connections through the VFS may read
/// it but never write its WAL; only a [`crate::ReplicaWal`] appends to it.
pub fn attach_replica(path: &Path) -> Result<Attachment, AttachError> {
    attach_as(path, None)
}

fn attach_as(path: &Path, sink: Option<Arc<dyn CaptureSink>>) -> Result<Attachment, AttachError> {
    crate::register().map_err(|e| AttachError::Register(e.code()))?;
    let key = crate::shim::full_pathname(path).map_err(|reason| AttachError::Path {
        path: path.to_path_buf(),
        reason,
    })?;
    let mut reg = REGISTRY.lock();
    if reg.contains_key(&key) {
        return Err(AttachError::AlreadyAttached(key));
    }
    // Before anything touches the files: no other process has them.
    let owner = crate::owner_lock::OwnerLock::acquire(Path::new(&key))?;
    let shared = Arc::new(DbShared {
        key: key.clone(),
        sink,
        capture: Mutex::new(Capture::default()),
        wal: WalFile::default(),
        run_from: AtomicU64::new(u64::MAX),
        in_flight: AtomicBool::new(false),
        db_syncs: AtomicU64::new(0),
        wal_syncs: AtomicU64::new(0),
        fail_next_wal_sync: AtomicBool::new(false),
        waiters: AtomicUsize::new(0),
        settle_lock: Mutex::new(()),
        settled: Condvar::new(),
    });
    reg.insert(key, Arc::clone(&shared));
    Ok(Attachment { shared, owner })
}

/// An attached database. Dropping it detaches the path (files already open
/// keep capturing into the same sink until they close).
#[derive(Debug)]
pub struct Attachment {
    shared: Arc<DbShared>,
    /// Held while attached: the database's files are this process's.
    owner: crate::owner_lock::OwnerLock,
}

impl Attachment {
    /// The database opened: its lock file stays once it is detached (one
    /// made for an open that failed goes with it).
    pub fn keep_lock_file(&self) {
        self.owner.keep();
    }

    /// The absolute path SQLite uses for this database.
    pub fn path(&self) -> &str {
        &self.shared.key
    }

    /// What capture has seen so far.
    pub fn stats(&self) -> CaptureStats {
        self.shared.capture.lock().stats()
    }

    /// Refuses, before it commits, any write transaction whose page images
    /// exceed `limit` bytes (None: no limit). The refused write fails with
    /// SQLITE_FULL and SQLite rolls it back; see
    /// [`Attachment::take_refused_too_large`].
    pub fn set_max_transaction_bytes(&self, limit: Option<u64>) {
        self.shared.capture.lock().set_max_transaction_bytes(limit);
    }

    /// Whether the latest refused transaction was refused for its size
    /// (and clears that): tells a size refusal from a full disk.
    pub fn take_refused_too_large(&self) -> bool {
        self.shared.capture.lock().take_refused_too_large()
    }

    /// Fault injection, for tests of what SQLite does when a commit fails
    /// after its commit frame is written: the next sync of the WAL fails
    /// with SQLITE_IOERR_FSYNC (and syncs nothing).
    #[doc(hidden)]
    pub fn fail_next_wal_sync(&self) {
        self.shared.fail_next_wal_sync.store(true, Ordering::SeqCst);
    }

    /// Successful syncs so far of the database file and of its WAL, by any
    /// connection: what a test of durability points counts.
    pub fn syncs(&self) -> (u64, u64) {
        (
            self.shared.db_syncs.load(Ordering::Relaxed),
            self.shared.wal_syncs.load(Ordering::Relaxed),
        )
    }

    /// The error that stopped capture, if any. A poisoned database refuses
    /// every further WAL write.
    pub fn poisoned(&self) -> Option<CaptureError> {
        self.shared.capture.lock().poisoned().cloned()
    }

    /// Whether no transaction is between its commit frame and its hand-off
    /// to the sink, without waiting: when true, every transaction that any
    /// read transaction ended before the call could see has reached the
    /// sink (as after [`Self::wait_commit_settled`]).
    pub fn commit_settled(&self) -> bool {
        !self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// Waits until no transaction is between its commit frame and its hand-off
    /// to the sink. After this returns, every transaction that any read
    /// transaction started before the call could see has reached the sink.
    pub fn wait_commit_settled(&self) {
        if !self.shared.in_flight.load(Ordering::SeqCst) {
            return;
        }
        self.shared.waiters.fetch_add(1, Ordering::SeqCst);
        let mut g = self.shared.settle_lock.lock();
        while self.shared.in_flight.load(Ordering::SeqCst) {
            self.shared.settled.wait(&mut g);
        }
        drop(g);
        self.shared.waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        let mut reg = REGISTRY.lock();
        if reg
            .get(&self.shared.key)
            .is_some_and(|s| Arc::ptr_eq(s, &self.shared))
        {
            reg.remove(&self.shared.key);
        }
    }
}
