//! A primary database: one writer connection, a pool of readers, and the
//! bookmark issuer that the capturing VFS feeds.

use crate::error::{CheckpointError, OpenError, QueryError, SessionError};
use crate::meta;
use crate::session::{Access, Constraint, Meta, Session};
use crate::value::{Row, Value};
use parking_lot::{Condvar, Mutex};
use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::{Connection, OpenFlags, StatementStatus, config::DbConfig, ffi};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use walrelay_replicator::{Bookmark, Epoch, Sequence};
use walrelay_vfs::{Attachment, CaptureSink, CapturedTransaction, SinkError};

/// Where each committed transaction goes once it has a bookmark: the seam the
/// replicator plugs into. Called in commit order while SQLite still holds
/// the WAL write lock; an error stops the database from taking writes.
pub trait TransactionSink: Send + Sync {
    fn committed(&self, bookmark: Bookmark, txn: &CapturedTransaction) -> Result<(), String>;
}

/// The output gate: holds every result until the state it reflects is
/// confirmed (durable on W followers). Writes go on committing behind it
/// (pipelining); only their results wait.
pub trait CommitGate: Send + Sync {
    /// Called before a write starts: waits, bounded, while too much is
    /// committed but unconfirmed; an error means the write must not run.
    fn admit_write(&self) -> Result<(), GateError>;
    /// Waits, bounded, until `bookmark` is confirmed.
    fn wait_confirmed(&self, bookmark: Bookmark) -> Result<(), GateError>;
}

/// Why the gate did not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GateError(pub String);

/// SQLite's `synchronous` setting for the local WAL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synchronous {
    Off,
    Normal,
    Full,
}

impl Synchronous {
    fn pragma(self) -> &'static str {
        match self {
            Synchronous::Off => "OFF",
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
        }
    }
}

/// SQLite's checkpoint modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointMode {
    Passive,
    Full,
    Restart,
    Truncate,
}

/// What a checkpoint did, in WAL frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointStats {
    pub wal_frames: u32,
    pub backfilled_frames: u32,
}

/// How to open a database.
#[derive(Clone)]
pub struct Options {
    /// Reader connections in the pool (at least 1).
    pub readers: usize,
    /// Durability of the local WAL. A single node's only durability, so FULL
    /// by default.
    pub synchronous: Synchronous,
    /// Run a PASSIVE checkpoint after a commit once the WAL holds this many
    /// frames.
    pub checkpoint_threshold_frames: u32,
    /// Page cache of the writer connection, in pages (SQLite's default if
    /// `None`). Tiny values force cache spills mid-transaction.
    pub writer_cache_size_pages: Option<u32>,
    /// How long a connection waits on a lock before failing.
    pub busy_timeout_ms: u64,
    /// The region label reported in `served_by_region`.
    pub region: String,
    /// Receives every committed transaction with its bookmark.
    pub sink: Option<Arc<dyn TransactionSink>>,
    /// Holds results until their bookmark is confirmed (replicated
    /// primaries). None: a result is released at local commit.
    pub gate: Option<Arc<dyn CommitGate>>,
    /// What one query, connection wait, transaction or the database may
    /// cost (D1's published limits by default).
    pub limits: crate::limits::Limits,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            readers: 4,
            synchronous: Synchronous::Full,
            checkpoint_threshold_frames: 4096,
            writer_cache_size_pages: None,
            busy_timeout_ms: 5_000,
            region: "local".to_string(),
            sink: None,
            gate: None,
            limits: crate::limits::Limits::default(),
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("readers", &self.readers)
            .field("synchronous", &self.synchronous)
            .field(
                "checkpoint_threshold_frames",
                &self.checkpoint_threshold_frames,
            )
            .field("writer_cache_size_pages", &self.writer_cache_size_pages)
            .field("busy_timeout_ms", &self.busy_timeout_ms)
            .field("region", &self.region)
            .field("sink", &self.sink.is_some())
            .field("gate", &self.gate.is_some())
            .field("limits", &self.limits)
            .finish()
    }
}

/// Gives each captured transaction the next bookmark. Runs under the WAL
/// write lock, so calls are serial and in commit order.
struct Issuer {
    epoch: Epoch,
    latest: AtomicU64,
    last_commit_frame: AtomicU32,
    downstream: Option<Arc<dyn TransactionSink>>,
}

impl CaptureSink for Issuer {
    fn committed(&self, txn: CapturedTransaction) -> Result<(), SinkError> {
        let prev = self.latest.load(Ordering::Acquire);
        let seq = Sequence(prev)
            .next()
            .ok_or_else(|| SinkError("sequence exhausted".into()))?;
        let bookmark = Bookmark::new(self.epoch, seq);
        if let Some(d) = &self.downstream {
            d.committed(bookmark, &txn).map_err(SinkError)?;
        }
        self.last_commit_frame
            .store(txn.wal.commit_frame.get(), Ordering::Relaxed);
        self.latest.store(seq.0, Ordering::Release);
        Ok(())
    }
}

const ALLOW_TX: u8 = 1;
const IN_BATCH: u8 = 2;

/// A connection plus the authorizer switches the engine flips around its own
/// BEGIN/COMMIT.
pub(crate) struct Conn {
    pub(crate) conn: Connection,
    auth: Arc<AtomicU8>,
}

impl Conn {
    fn engine_exec(&self, sql: &str) -> rusqlite::Result<()> {
        self.auth.fetch_or(ALLOW_TX, Ordering::SeqCst);
        let r = self.conn.execute_batch(sql);
        self.auth.fetch_and(!ALLOW_TX, Ordering::SeqCst);
        r
    }
}

pub(crate) struct ReaderPool {
    idle: Mutex<Vec<Conn>>,
    available: Condvar,
}

impl ReaderPool {
    pub(crate) fn new(conns: Vec<Conn>) -> ReaderPool {
        ReaderPool {
            idle: Mutex::new(conns),
            available: Condvar::new(),
        }
    }

    fn take(&self) -> Conn {
        let mut idle = self.idle.lock();
        loop {
            if let Some(c) = idle.pop() {
                return c;
            }
            self.available.wait(&mut idle);
        }
    }
    fn give(&self, c: Conn) {
        self.idle.lock().push(c);
        self.available.notify_one();
    }
}

pub(crate) struct Inner {
    // Readers are declared (and so dropped) before the role, whose
    // attachment or applier must outlive every connection.
    pub(crate) readers: ReaderPool,
    pub(crate) role: Role,
    pub(crate) path: PathBuf,
    pub(crate) region: String,
}

/// What a database is in the replication topology. One per database, held
/// in its `Arc`, so the size difference between variants costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Role {
    Primary(PrimaryRole),
    Replica(crate::replica::ReplicaRole),
}

pub(crate) struct PrimaryRole {
    writer: Mutex<Conn>,
    issuer: Arc<Issuer>,
    attachment: Attachment,
    checkpoint_threshold_frames: u32,
    gate: Option<Arc<dyn CommitGate>>,
}

/// A database: a primary ([`Database::open`]) or the read side of a
/// replica ([`crate::Replica`]). Cheap to clone; every clone is the same
/// database.
#[derive(Clone)]
pub struct Database {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database")
            .field("path", &self.inner.path)
            .field("latest", &self.latest_bookmark())
            .finish()
    }
}

/// What executing one statement produced.
pub(crate) struct Output {
    pub columns: Arc<[String]>,
    pub rows: Vec<Row>,
    pub meta: Meta,
}

const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

fn path_string(p: &Path) -> String {
    p.display().to_string()
}

/// Checks the file header before SQLite touches the file: returns whether
/// the database is already in WAL mode (false for a file to be created).
fn inspect(path: &Path) -> Result<bool, OpenError> {
    use std::io::Read;
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => {
            return Err(OpenError::CantOpen {
                path: path_string(path),
                reason: e.to_string(),
            });
        }
    };
    let mut head = [0u8; 100];
    let mut n = 0;
    while n < head.len() {
        match f.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) => {
                return Err(OpenError::CantOpen {
                    path: path_string(path),
                    reason: e.to_string(),
                });
            }
        }
    }
    if n == 0 {
        return Ok(false); // empty file: SQLite treats it as a new database
    }
    if n < head.len() || &head[..16] != SQLITE_MAGIC {
        return Err(OpenError::NotADatabase {
            path: path_string(path),
        });
    }
    // Bytes 18 and 19 are the read and write format versions: 2 means WAL.
    Ok(head[18] == 2 && head[19] == 2)
}

pub(crate) fn map_open_error(path: &Path, e: rusqlite::Error) -> OpenError {
    let p = path_string(path);
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase) => OpenError::NotADatabase { path: p },
        Some(rusqlite::ErrorCode::ReadOnly) => OpenError::ReadOnly {
            path: p,
            reason: e.to_string(),
        },
        Some(rusqlite::ErrorCode::CannotOpen) => {
            if dir_is_read_only(path) {
                OpenError::ReadOnly {
                    path: p,
                    reason: e.to_string(),
                }
            } else {
                OpenError::CantOpen {
                    path: p,
                    reason: e.to_string(),
                }
            }
        }
        Some(rusqlite::ErrorCode::DatabaseCorrupt) => OpenError::Corrupt {
            path: p,
            reason: e.to_string(),
        },
        _ => OpenError::Sqlite(e),
    }
}

/// Whether the directory holding `path` refuses new files: probed by
/// creating one, since permission bits lie to root.
fn dir_is_read_only(path: &Path) -> bool {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let probe = dir.join(format!(".walrelay-probe-{}", std::process::id()));
    match std::fs::File::create(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            false
        }
        Err(e) => is_read_only_error(&e),
    }
}

/// EACCES, EPERM (an immutable directory) or EROFS.
fn is_read_only_error(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::PermissionDenied
        || e.kind() == std::io::ErrorKind::ReadOnlyFilesystem
        || e.raw_os_error() == Some(1)
}

fn meta_error(path: &Path, e: meta::MetaError) -> OpenError {
    match e {
        meta::MetaError::Io(io) if is_read_only_error(&io) => OpenError::ReadOnly {
            path: path_string(path),
            reason: io.to_string(),
        },
        other => OpenError::Meta(other.to_string()),
    }
}

pub(crate) fn configure(
    conn: Connection,
    opts: &Options,
    writer: bool,
) -> Result<Conn, rusqlite::Error> {
    conn.busy_timeout(Duration::from_millis(opts.busy_timeout_ms))?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
    conn.execute_batch("PRAGMA wal_autocheckpoint=0;")?;
    if writer {
        conn.execute_batch(&format!(
            "PRAGMA synchronous={};",
            opts.synchronous.pragma()
        ))?;
        if let Some(pages) = opts.writer_cache_size_pages {
            conn.execute_batch(&format!("PRAGMA cache_size={pages};"))?;
        }
    }
    conn.set_prepared_statement_cache_capacity(128);
    let auth = Arc::new(AtomicU8::new(0));
    let flags = Arc::clone(&auth);
    let mut conn = conn;
    conn.authorizer(Some(move |ctx: AuthContext<'_>| {
        let f = flags.load(Ordering::SeqCst);
        match ctx.action {
            // VACUUM attaches a nameless temporary database; any other
            // ATTACH (including VACUUM INTO a file) would reach files
            // outside walrelay's control.
            AuthAction::Attach { filename } if !filename.is_empty() => Authorization::Deny,
            // Inside a batch, BEGIN/COMMIT/ROLLBACK would end the batch's
            // transaction early. Outside one they are allowed at prepare
            // time (VACUUM begins a transaction internally) and a statement
            // that leaves a transaction open is rolled back and refused.
            AuthAction::Transaction { .. } if f & IN_BATCH != 0 && f & ALLOW_TX == 0 => {
                Authorization::Deny
            }
            _ => Authorization::Allow,
        }
    }))?;
    Ok(Conn { conn, auth })
}

impl Database {
    /// Opens (creating if needed) the primary database at `path`.
    ///
    /// Each open starts a new epoch, persisted in `<path>-walrelay` before
    /// the first write, so bookmarks keep increasing across restarts.
    pub fn open(path: impl AsRef<Path>, options: Options) -> Result<Database, OpenError> {
        let path = path.as_ref();
        if options.readers == 0 {
            return Err(OpenError::Options("readers must be at least 1".into()));
        }
        let meta_path = meta::sidecar_path(path);
        let previous = meta::load(&meta_path).map_err(|e| meta_error(path, e))?;
        let epoch = previous.map_or(1, |m| m.epoch.saturating_add(1));
        let issuer = Arc::new(Issuer {
            epoch: Epoch(epoch),
            latest: AtomicU64::new(0),
            last_commit_frame: AtomicU32::new(0),
            downstream: options.sink.clone(),
        });
        // Attach first: a second open of the same database in this process
        // fails here, before the epoch on disk moves or the file is touched.
        let attachment = walrelay_vfs::attach(path, Arc::clone(&issuer) as Arc<dyn CaptureSink>)?;
        // Only now touch the file: closing any descriptor of a database drops
        // every POSIX lock this process holds on it, so the header check and
        // the bootstrap must not run while another connection of this
        // process has it open (the attach above refuses that case).
        let is_wal = inspect(path)?;
        if !is_wal {
            // Switching to WAL rewrites page 1 through a rollback journal,
            // which the walrelay VFS refuses by design: do it once with the
            // plain unix VFS, before capture begins.
            let c = Connection::open(path).map_err(|e| map_open_error(path, e))?;
            let mode: String = c
                .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
                .map_err(|e| map_open_error(path, e))?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(OpenError::CantOpen {
                    path: path_string(path),
                    reason: format!("could not switch to WAL mode (journal_mode is {mode})"),
                });
            }
            c.close().map_err(|(_, e)| map_open_error(path, e))?;
        }

        meta::store(&meta_path, &meta::MetaFile { epoch }).map_err(|e| meta_error(path, e))?;
        let open = |flags: OpenFlags| {
            Connection::open_with_flags_and_vfs(path, flags, walrelay_vfs::VFS_NAME)
                .map_err(|e| map_open_error(path, e))
        };
        let rw = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let writer = configure(open(rw)?, &options, true).map_err(|e| map_open_error(path, e))?;
        let mode: String = writer
            .conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .map_err(|e| map_open_error(path, e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(OpenError::CantOpen {
                path: path_string(path),
                reason: format!("database is not in WAL mode (journal_mode is {mode})"),
            });
        }
        let mut readers = Vec::with_capacity(options.readers);
        for _ in 0..options.readers {
            let ro = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
            readers
                .push(configure(open(ro)?, &options, false).map_err(|e| map_open_error(path, e))?);
        }
        Ok(Database {
            inner: Arc::new(Inner {
                readers: ReaderPool::new(readers),
                role: Role::Primary(PrimaryRole {
                    writer: Mutex::new(writer),
                    issuer,
                    attachment,
                    checkpoint_threshold_frames: options.checkpoint_threshold_frames,
                    gate: options.gate.clone(),
                }),
                path: path.to_path_buf(),
                region: options.region.clone(),
            }),
        })
    }

    fn primary(&self) -> Option<&PrimaryRole> {
        match &self.inner.role {
            Role::Primary(p) => Some(p),
            Role::Replica(_) => None,
        }
    }

    /// The newest bookmark this database can serve: the last issued on a
    /// primary, the last confirmed on a replica.
    pub fn latest_bookmark(&self) -> Bookmark {
        match &self.inner.role {
            Role::Primary(p) => {
                let i = &p.issuer;
                Bookmark::new(i.epoch, Sequence(i.latest.load(Ordering::Acquire)))
            }
            Role::Replica(r) => r.visible(),
        }
    }

    /// The epoch this database's newest bookmark belongs to (on a primary,
    /// the epoch this open issues bookmarks in).
    pub fn epoch(&self) -> Epoch {
        match &self.inner.role {
            Role::Primary(p) => p.issuer.epoch,
            Role::Replica(r) => r.visible().epoch,
        }
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// What the capturing VFS has seen on this primary (None on a replica).
    pub fn capture_stats(&self) -> Option<walrelay_vfs::CaptureStats> {
        self.primary().map(|p| p.attachment.stats())
    }

    /// Whether this is a primary (writes) or a replica (reads only).
    pub fn is_primary(&self) -> bool {
        self.primary().is_some()
    }

    /// Starts a session (D1's `withSession`).
    pub fn session(&self, constraint: Constraint) -> Result<Session, SessionError> {
        let start = match constraint {
            Constraint::Bookmark(b) => {
                self.check_bookmark(b)?;
                Some(b)
            }
            Constraint::FirstPrimary | Constraint::FirstUnconstrained => None,
        };
        Ok(Session::new(self.clone(), constraint, start))
    }

    /// A bookmark this database can serve: not beyond what it has issued
    /// (a replica instead waits for it, boundedly, when a query needs it).
    pub fn check_bookmark(&self, b: Bookmark) -> Result<(), SessionError> {
        let Some(_) = self.primary() else {
            return Ok(());
        };
        let latest = self.latest_bookmark();
        if b > latest {
            return Err(SessionError::FutureBookmark {
                requested: b,
                latest,
            });
        }
        Ok(())
    }

    /// Runs a checkpoint. Checkpoints never lose a captured transaction:
    /// they only copy committed frames into the database file. On a replica
    /// every mode runs as PASSIVE (its WAL restarts are the applier's).
    pub fn checkpoint(&self, mode: CheckpointMode) -> Result<CheckpointStats, CheckpointError> {
        match &self.inner.role {
            Role::Primary(p) => checkpoint_on(&p.writer.lock().conn, mode),
            Role::Replica(r) => r.checkpoint(),
        }
    }

    fn meta(&self, started: Instant, bookmark: Bookmark) -> Meta {
        Meta {
            served_by_primary: self.is_primary(),
            served_by_region: self.inner.region.clone(),
            bookmark,
            rows_read: 0,
            rows_written: 0,
            changes: 0,
            last_row_id: 0,
            duration_us: started.elapsed().as_micros() as u64,
        }
    }

    fn check_capture(&self) -> Result<(), QueryError> {
        match self.primary().and_then(|p| p.attachment.poisoned()) {
            Some(e) => Err(QueryError::CaptureFailed(e)),
            None => Ok(()),
        }
    }

    /// After a write failed: if capture failed, say so instead.
    fn explain(&self, e: QueryError) -> QueryError {
        match self.primary().and_then(|p| p.attachment.poisoned()) {
            Some(p) => QueryError::CaptureFailed(p),
            None => e,
        }
    }

    /// Runs one statement: on a reader if SQLite says it is read-only,
    /// otherwise on the writer (a replica refuses it). `at_least` is the
    /// session's bookmark: the read must reflect at least that state.
    pub(crate) fn execute(
        &self,
        sql: &str,
        params: &[Value],
        at_least: Option<Bookmark>,
        access: Access,
    ) -> Result<Output, QueryError> {
        let started = Instant::now();
        // A refused capture left a transaction in the local WAL that has no
        // bookmark and never will: serve nothing that could show it.
        self.check_capture()?;
        let mut reader = self.inner.readers.take();
        let mut readonly = reader.conn.prepare_cached(sql).map(|s| s.readonly());
        if let (Role::Replica(r), Some(b)) = (&self.inner.role, at_least)
            && r.visible() < b
        {
            if matches!(readonly, Ok(false)) {
                // A write goes to the primary anyway: no reason to wait for
                // this replica to catch up first.
                self.inner.readers.give(reader);
                return Err(QueryError::ReadOnlyReplica);
            }
            // A read (or a statement naming what the session's bookmark
            // created but this replica has not applied yet): wait, then
            // classify again against the newer schema.
            self.inner.readers.give(reader);
            r.wait_visible(b)?;
            reader = self.inner.readers.take();
            readonly = reader.conn.prepare_cached(sql).map(|s| s.readonly());
        }
        let readonly = match readonly {
            Ok(r) => r,
            Err(e) => {
                self.inner.readers.give(reader);
                return Err(QueryError::sql(e));
            }
        };
        if readonly {
            let r = run_statement(&reader.conn, sql, params, Prepare::Cached);
            // A statement that opened a transaction must not leave the
            // pooled connection inside it.
            let left_open = !reader.conn.is_autocommit();
            if left_open {
                let _ = reader.engine_exec("ROLLBACK");
            }
            self.inner.readers.give(reader);
            let (columns, rows, counts) = r?;
            if left_open {
                return Err(tx_control_refused());
            }
            let bookmark = match &self.inner.role {
                Role::Primary(p) => {
                    // Any transaction this read could have seen has its
                    // bookmark once in-flight commits settle.
                    p.attachment.wait_commit_settled();
                    self.check_capture()?;
                    let bookmark = self.latest_bookmark();
                    // No reader sees an unconfirmed transaction: hold the
                    // result until everything it could reflect is confirmed.
                    p.gate_wait(bookmark)?;
                    bookmark
                }
                // Raised before a confirm publishes: at least what was seen.
                Role::Replica(r) => r.reported(),
            };
            let mut meta = self.meta(started, bookmark);
            meta.rows_read = counts.rows_read;
            return Ok(Output {
                columns,
                rows,
                meta,
            });
        }
        self.inner.readers.give(reader);
        if access == Access::ReadOnly {
            return Err(QueryError::ReadOnlyAccess);
        }
        let Some(p) = self.primary() else {
            return Err(QueryError::ReadOnlyReplica);
        };
        p.gate_admit()?;
        let w = p.writer.lock();
        let r = run_statement(&w.conn, sql, params, Prepare::Cached);
        if !w.conn.is_autocommit() {
            let _ = w.engine_exec("ROLLBACK");
            r?;
            return Err(tx_control_refused());
        }
        let (columns, rows, counts) = r.map_err(|e| self.explain(e))?;
        self.check_capture()?;
        let mut meta = self.meta(started, self.latest_bookmark());
        meta.rows_read = counts.rows_read;
        meta.rows_written = counts.changes;
        meta.changes = counts.changes;
        meta.last_row_id = w.conn.last_insert_rowid();
        p.maybe_checkpoint(&w.conn);
        drop(w);
        // Later writers commit while this result waits (pipelining).
        p.gate_wait(meta.bookmark)?;
        meta.duration_us = started.elapsed().as_micros() as u64;
        Ok(Output {
            columns,
            rows,
            meta,
        })
    }

    /// Runs statements atomically in one write transaction: all or nothing.
    pub(crate) fn execute_batch(
        &self,
        stmts: &[(String, Vec<Value>)],
        access: Access,
    ) -> Result<Vec<Output>, QueryError> {
        let started = Instant::now();
        self.check_capture()?;
        let Some(p) = self.primary() else {
            return Err(QueryError::ReadOnlyReplica);
        };
        p.gate_admit()?;
        let w = p.writer.lock();
        w.engine_exec("BEGIN IMMEDIATE")
            .map_err(|e| self.explain(QueryError::sql(e)))?;
        w.auth.fetch_or(IN_BATCH, Ordering::SeqCst);
        let mut outs = Vec::with_capacity(stmts.len());
        let mut failure = None;
        for (index, (sql, params)) in stmts.iter().enumerate() {
            let run = refuse_write(&w.conn, sql, access)
                .and_then(|()| run_statement(&w.conn, sql, params, Prepare::Fresh));
            match run {
                Ok(o) if !w.conn.is_autocommit() => outs.push(o),
                Ok(_) => {
                    failure = Some(QueryError::Batch {
                        index,
                        source: Box::new(tx_control_refused()),
                    });
                    break;
                }
                Err(e) => {
                    failure = Some(QueryError::Batch {
                        index,
                        source: Box::new(e),
                    });
                    break;
                }
            }
        }
        w.auth.fetch_and(!IN_BATCH, Ordering::SeqCst);
        if let Some(e) = failure {
            if !w.conn.is_autocommit() {
                let _ = w.engine_exec("ROLLBACK");
            }
            return Err(self.explain(e));
        }
        if let Err(e) = w.engine_exec("COMMIT") {
            if !w.conn.is_autocommit() {
                let _ = w.engine_exec("ROLLBACK");
            }
            return Err(self.explain(QueryError::sql(e)));
        }
        self.check_capture()?;
        let bookmark = self.latest_bookmark();
        let last_row_id = w.conn.last_insert_rowid();
        p.maybe_checkpoint(&w.conn);
        drop(w);
        p.gate_wait(bookmark)?;
        Ok(outs
            .into_iter()
            .map(|(columns, rows, counts)| {
                let mut meta = self.meta(started, bookmark);
                meta.rows_read = counts.rows_read;
                meta.rows_written = counts.changes;
                meta.changes = counts.changes;
                meta.last_row_id = last_row_id;
                Output {
                    columns,
                    rows,
                    meta,
                }
            })
            .collect())
    }
}

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
            match checkpoint_on(&w.conn, CheckpointMode::Truncate) {
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
                w.conn.handle(),
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

impl PrimaryRole {
    fn gate_admit(&self) -> Result<(), QueryError> {
        match &self.gate {
            Some(g) => g
                .admit_write()
                .map_err(|e| QueryError::WriteNotAdmitted { reason: e.0 }),
            None => Ok(()),
        }
    }

    fn gate_wait(&self, bookmark: Bookmark) -> Result<(), QueryError> {
        match &self.gate {
            Some(g) => g
                .wait_confirmed(bookmark)
                .map_err(|e| QueryError::NotConfirmed {
                    bookmark,
                    reason: e.0,
                }),
            None => Ok(()),
        }
    }

    fn maybe_checkpoint(&self, conn: &Connection) {
        let frames = self.issuer.last_commit_frame.load(Ordering::Relaxed);
        if frames >= self.checkpoint_threshold_frames {
            // Busy is fine: the next commit tries again.
            let _ = checkpoint_on(conn, CheckpointMode::Passive);
        }
    }
}

/// Under read-only access, refuses a batch statement SQLite calls a write,
/// before it runs: judged inside the batch's transaction, against the
/// schema the statement would run on.
fn refuse_write(conn: &Connection, sql: &str, access: Access) -> Result<(), QueryError> {
    if access == Access::ReadWrite {
        return Ok(());
    }
    if conn.prepare(sql).map_err(QueryError::sql)?.readonly() {
        Ok(())
    } else {
        Err(QueryError::ReadOnlyAccess)
    }
}

fn tx_control_refused() -> QueryError {
    QueryError::NotSupported(crate::error::REFUSED_STATEMENT.into())
}

struct Counts {
    rows_read: u64,
    changes: u64,
}

type StatementOutput = (Arc<[String]>, Vec<Row>, Counts);

/// How a statement is prepared. Batch statements are prepared fresh so the
/// authorizer judges each one inside the batch: a cached statement is not
/// authorized again.
#[derive(Clone, Copy)]
enum Prepare {
    Cached,
    Fresh,
}

/// Prepares, binds and runs one statement to completion.
fn run_statement(
    conn: &Connection,
    sql: &str,
    params: &[Value],
    how: Prepare,
) -> Result<StatementOutput, QueryError> {
    let mut fresh;
    let mut cached;
    let stmt: &mut rusqlite::Statement<'_> = match how {
        Prepare::Cached => {
            cached = conn.prepare_cached(sql).map_err(QueryError::sql)?;
            &mut cached
        }
        Prepare::Fresh => {
            fresh = conn.prepare(sql).map_err(QueryError::sql)?;
            &mut fresh
        }
    };
    let expected = stmt.parameter_count();
    if expected != params.len() {
        return Err(QueryError::ParameterCount {
            expected,
            given: params.len(),
        });
    }
    for (i, p) in params.iter().enumerate() {
        stmt.raw_bind_parameter(i + 1, p).map_err(QueryError::sql)?;
    }
    let columns: Arc<[String]> = stmt.column_names().map(String::from).collect();
    let readonly = stmt.readonly();
    stmt.reset_status(StatementStatus::FullscanStep);
    let before = conn.total_changes();
    let mut rows = Vec::new();
    {
        let mut rs = stmt.raw_query();
        while let Some(row) = rs.next().map_err(QueryError::sql)? {
            let values = (0..columns.len())
                .map(|i| Value::from(row.get_ref_unwrap(i)))
                .collect();
            rows.push(Row::new(Arc::clone(&columns), values));
        }
    }
    // rows_read approximates D1's count: rows stepped over by full scans
    // plus rows returned (SQLite keeps no per-row read counter).
    let rows_read =
        stmt.get_status(StatementStatus::FullscanStep).max(0) as u64 + rows.len() as u64;
    let changes = if readonly {
        0
    } else {
        conn.total_changes().saturating_sub(before)
    };
    Ok((columns, rows, Counts { rows_read, changes }))
}

pub(crate) fn checkpoint_on(
    conn: &Connection,
    mode: CheckpointMode,
) -> Result<CheckpointStats, CheckpointError> {
    let m = match mode {
        CheckpointMode::Passive => ffi::SQLITE_CHECKPOINT_PASSIVE,
        CheckpointMode::Full => ffi::SQLITE_CHECKPOINT_FULL,
        CheckpointMode::Restart => ffi::SQLITE_CHECKPOINT_RESTART,
        CheckpointMode::Truncate => ffi::SQLITE_CHECKPOINT_TRUNCATE,
    };
    let (mut log, mut ckpt) = (0, 0);
    // SAFETY: the handle belongs to a live connection that the caller holds
    // exclusively (behind the writer mutex) for the duration of the call;
    // the schema name is a valid NUL-terminated string.
    let rc = unsafe {
        ffi::sqlite3_wal_checkpoint_v2(conn.handle(), c"main".as_ptr(), m, &mut log, &mut ckpt)
    };
    match rc {
        ffi::SQLITE_OK => Ok(CheckpointStats {
            wal_frames: log.max(0) as u32,
            backfilled_frames: ckpt.max(0) as u32,
        }),
        ffi::SQLITE_BUSY => Err(CheckpointError::Busy),
        code => Err(CheckpointError::Sqlite { code }),
    }
}
