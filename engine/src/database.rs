//! A primary database: one writer connection, a pool of readers, and the
//! bookmark issuer that the capturing VFS feeds.

mod durable_files;
mod gate;
mod growth;
mod open_checks;
mod seams;

pub(crate) use gate::checkpoint_on;
pub(crate) use open_checks::attach_error;
pub(crate) use open_checks::map_open_error;
use open_checks::{inspect, meta_error, path_string};
pub use seams::{CommitGate, GateError, ShipError, TransactionSink};

use crate::error::{CheckpointError, OpenError, QueryError, SessionError};
use crate::limits::Limits;
use crate::meta;
use crate::pool::{Pooled, ReaderPool};
use crate::session::{Constraint, Meta, Session};
use crate::value::Row;
use parking_lot::Mutex;
use rusqlite::{Connection, OpenFlags, config::DbConfig, ffi};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use walrelay_replicator::{Bookmark, Epoch, Sequence};
use walrelay_vfs::{Attachment, CaptureSink, CapturedTransaction, SinkError};

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
    /// Most reader connections (at least 1): the first opens with the
    /// database, the others when concurrent reads need them.
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
    /// How much of the database file each reader connection maps into
    /// memory (SQLite's `mmap_size`; 0: none, every page is a `pread`).
    /// A read transaction that follows a commit starts with an empty page
    /// cache (SQLite drops it when the WAL changed), so without a mapping
    /// each read pays a system call and a 4 KiB copy per page it visits;
    /// mapped, the pages it needs from the database file are where the
    /// kernel's page cache already holds them. Pages still in the WAL are
    /// read as before. The cost: address space (not memory) up to the
    /// file's size per reader, and a disk error while reading a mapped
    /// page is a `SIGBUS` rather than an I/O error (SQLite's documented
    /// trade-off; papers/performance.md, lever 52). At most 4,096
    /// readers of the process map at once (each mapping is one of the kernel's
    /// `vm.max_map_count`); the others read with `pread`.
    pub reader_mmap_bytes: u64,
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
    /// The epoch to issue bookmarks in, when it was won elsewhere (a
    /// replicated primary wins it from its followers); it must be newer
    /// than any this database used. None: the stored epoch plus one.
    pub epoch: Option<Epoch>,
    /// Group commit: single-statement writes (INSERT, UPDATE, DELETE,
    /// REPLACE) that queue while the writer is busy commit together, as
    /// one transaction whose bookmark they share; each one's outcome is
    /// still its own. Off: every write is its own transaction.
    pub group_commit: bool,
    /// How long a group's leader waits at most, holding the writer, for
    /// more writes to queue before it takes them, when at least
    /// [`GROUP_DELAY_SIBLINGS`] writes wait at the output gate (so more
    /// are about to come back); it stops waiting as soon as as many
    /// writes as were at the gate have queued. PostgreSQL's `commit_delay`
    /// and `commit_siblings`: fewer, larger groups cost fewer messages,
    /// syncs and wake-ups per write under load, and a lone writer never
    /// waits. 0: no wait. The default, 1 ms, is about two quorum rounds
    /// here: long enough for the writes of a group still awaiting its
    /// confirmation to come back and join (papers/performance.md, lever
    /// 33); a deployment whose writers think between writes may want less.
    pub group_commit_delay_us: u64,
}

/// [`Options::reader_mmap_bytes`] by default: 1 GiB of each reader's
/// address space, D1's largest database being ten times that (the rest
/// of a larger file is read with `pread`).
pub const DEFAULT_READER_MMAP_BYTES: u64 = 1 << 30;

/// Writes waiting at the output gate before a group's leader waits
/// [`Options::group_commit_delay_us`] for more.
pub const GROUP_DELAY_SIBLINGS: usize = 4;

/// The longest [`Options::group_commit_delay_us`]: a leader waits holding
/// the writer, so every write behind it waits as long.
pub const MAX_GROUP_COMMIT_DELAY_US: u64 = 100_000;

impl Default for Options {
    fn default() -> Options {
        Options {
            readers: 16,
            synchronous: Synchronous::Full,
            checkpoint_threshold_frames: 4096,
            writer_cache_size_pages: None,
            reader_mmap_bytes: DEFAULT_READER_MMAP_BYTES,
            busy_timeout_ms: 5_000,
            region: "local".to_string(),
            sink: None,
            gate: None,
            limits: crate::limits::Limits::default(),
            epoch: None,
            group_commit: true,
            group_commit_delay_us: 1_000,
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
            .field("reader_mmap_bytes", &self.reader_mmap_bytes)
            .field("busy_timeout_ms", &self.busy_timeout_ms)
            .field("region", &self.region)
            .field("sink", &self.sink.is_some())
            .field("gate", &self.gate.is_some())
            .field("limits", &self.limits)
            .field("group_commit", &self.group_commit)
            .field("group_commit_delay_us", &self.group_commit_delay_us)
            .finish()
    }
}

/// Gives each captured transaction the next bookmark. Runs under the WAL
/// write lock, so calls are serial and in commit order.
struct Issuer {
    epoch: Epoch,
    latest: AtomicU64,
    last_commit_frame: AtomicU32,
    /// The database's size after the last commit, in pages.
    db_pages: AtomicU32,
    downstream: Option<Arc<dyn TransactionSink>>,
}

impl CaptureSink for Issuer {
    fn committed(&self, txn: CapturedTransaction) -> Result<(), SinkError> {
        let prev = self.latest.load(Ordering::Acquire);
        let positions = self
            .downstream
            .as_ref()
            .map_or(1, |d| d.positions(&txn).max(1));
        let seq = prev
            .checked_add(positions)
            .map(Sequence)
            .ok_or_else(|| SinkError("sequence exhausted".into()))?;
        let bookmark = Bookmark::new(self.epoch, seq);
        if let Some(d) = &self.downstream {
            d.committed(bookmark, &txn)
                .map_err(|e| SinkError(e.to_string()))?;
        }
        self.last_commit_frame
            .store(txn.wal.commit_frame.get(), Ordering::Relaxed);
        self.db_pages
            .store(txn.pages.db_size_pages(), Ordering::Relaxed);
        self.latest.store(seq.0, Ordering::Release);
        Ok(())
    }
}

// The authorizer's batch switch (see crate::sandbox).
const IN_BATCH: u8 = crate::sandbox::IN_BATCH;

/// A connection plus the authorizer switches the engine flips around its own
/// BEGIN/COMMIT.
pub(crate) struct Conn {
    pub(crate) conn: Connection,
    pub(crate) auth: Arc<AtomicU8>,
    /// A reader's permission to map its database file, if it took one:
    /// after `conn`, so it is given back once the mapping is gone.
    _mapped: Option<crate::mmap_budget::MapSlot>,
}

impl Conn {
    pub(crate) fn engine_exec(&self, sql: &str) -> rusqlite::Result<()> {
        crate::sandbox::as_engine(self, |c| c.execute_batch(sql))
    }

    /// [`Conn::engine_exec`] for one of the engine's own fixed statements
    /// (`BEGIN IMMEDIATE`, `COMMIT`, a savepoint's), prepared once and
    /// kept in the connection's statement cache: a group prepared its
    /// `SAVEPOINT` and `RELEASE` for every member, about 7% of the
    /// leader's CPU. Only a `&'static str` is taken, never text built
    /// from a request. A user statement of the same text finds the cached
    /// one: such a statement is transaction control, which the authorizer
    /// allows outside a batch whatever the switch, and a batch prepares
    /// its statements afresh (so through the authorizer).
    pub(crate) fn engine_exec_cached(&self, sql: &'static str) -> rusqlite::Result<()> {
        debug_assert!(!sql.contains(';'), "one statement: {sql}");
        // Re-preparing after a schema change consults the authorizer too,
        // so the switch covers the step as well as the prepare.
        crate::sandbox::as_engine(self, |c| {
            c.prepare_cached(sql)
                .and_then(|mut s| s.execute([]))
                .map(drop)
        })
    }

    /// Inside a batch the authorizer refuses transaction control.
    pub(crate) fn set_in_batch(&self, on: bool) {
        if on {
            self.auth.fetch_or(IN_BATCH, Ordering::SeqCst);
        } else {
            self.auth.fetch_and(!IN_BATCH, Ordering::SeqCst);
        }
    }
}

pub(crate) struct Inner {
    // Readers are declared (and so dropped) before the role, whose
    // attachment or applier must outlive every connection.
    pub(crate) readers: ReaderPool,
    /// Prepares statements to classify them when every reader is busy.
    pub(crate) classifier: Mutex<Pooled>,
    pub(crate) role: Role,
    pub(crate) limits: Limits,
    /// Set by [`Database::stop_queries`]; every connection's watch reads it.
    pub(crate) stopping: Arc<AtomicBool>,
    pub(crate) path: PathBuf,
    pub(crate) region: String,
    /// Statements that ran past the calling thread's budget: reads
    /// ([`crate::read_on_worker`]) and lone writes
    /// ([`crate::group_write_async`]), by their text.
    pub(crate) long_reads: crate::read_on_worker::LongReads,
    /// The readers' busy timeout, restored after a read on the calling
    /// thread (which runs without one).
    pub(crate) reader_busy_timeout: Duration,
}

/// What a database is in the replication topology. One per database, held
/// in its `Arc`, so the size difference between variants costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Role {
    Primary(PrimaryRole),
    Replica(crate::replica::ReplicaRole),
}

pub(crate) struct PrimaryRole {
    pub(crate) writer: Mutex<Pooled>,
    /// Group commit of plain DML writes (`Options::group_commit`).
    pub(crate) write_groups: Option<crate::group_write::WriteGroups>,
    issuer: Arc<Issuer>,
    pub(crate) attachment: Attachment,
    checkpoint_threshold_frames: u32,
    gate: Option<Arc<dyn CommitGate>>,
    max_transaction_bytes: u64,
    size_limit: crate::sandbox::SizeLimit,
    /// Writes that would grow the file are refused ([`growth`]).
    growth_frozen: std::sync::atomic::AtomicBool,
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
    // A reader maps only within the process's budget of mappings.
    let mapped = if writer || opts.reader_mmap_bytes == 0 {
        None
    } else {
        crate::mmap_budget::READERS.take()
    };
    if mapped.is_some() {
        // SQLite answers with the size it took (capped at its compiled
        // maximum), a row that execute_batch would not read.
        let set = conn.query_row(
            &format!("PRAGMA mmap_size={}", opts.reader_mmap_bytes),
            [],
            |r| r.get::<_, i64>(0),
        );
        match set {
            Ok(_) | Err(rusqlite::Error::QueryReturnedNoRows) => {}
            Err(e) => return Err(e),
        }
    }
    conn.set_prepared_statement_cache_capacity(128);
    let mut conn = conn;
    // Last: from here on clients' SQL passes the sandbox's authorizer.
    let auth = crate::sandbox::install(&mut conn, &opts.limits, writer)?;
    Ok(Conn {
        conn,
        auth,
        _mapped: mapped,
    })
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
        if options.limits.max_transaction_bytes < crate::limits::MIN_TRANSACTION_BYTES {
            return Err(OpenError::Options(format!(
                "max_transaction_bytes must be at least {} (four 4 KiB pages), got {}",
                crate::limits::MIN_TRANSACTION_BYTES,
                options.limits.max_transaction_bytes
            )));
        }
        if options.group_commit_delay_us > MAX_GROUP_COMMIT_DELAY_US {
            return Err(OpenError::Options(format!(
                "group_commit_delay_us must be at most {MAX_GROUP_COMMIT_DELAY_US} (it holds the writer)"
            )));
        }
        let meta_path = meta::sidecar_path(path);
        let previous = meta::load(&meta_path).map_err(|e| meta_error(path, e))?;
        // Where a counter must not overflow, refuse rather than saturate: a
        // repeated epoch would repeat bookmarks.
        let stored = previous.map_or(0, |m| m.epoch);
        let epoch = match options.epoch {
            Some(won) if won.0 > stored => won.0,
            Some(won) => {
                return Err(OpenError::EpochNotNewer {
                    epoch: won.0,
                    stored,
                });
            }
            None => stored
                .checked_add(1)
                .ok_or(OpenError::EpochExhausted { epoch: stored })?,
        };
        let issuer = Arc::new(Issuer {
            epoch: Epoch(epoch),
            latest: AtomicU64::new(0),
            last_commit_frame: AtomicU32::new(0),
            db_pages: AtomicU32::new(0),
            downstream: options.sink.clone(),
        });
        // Attach first: a second open of the same database in this process
        // fails here, before the epoch on disk moves or the file is touched.
        let attachment = walrelay_vfs::attach(path, Arc::clone(&issuer) as Arc<dyn CaptureSink>)
            .map_err(|e| attach_error(path, e))?;
        attachment.set_max_transaction_bytes(Some(options.limits.max_transaction_bytes));
        // Only now touch the file: closing any descriptor of a database drops
        // every POSIX lock this process holds on it, so the header check and
        // the bootstrap must not run while another connection of this
        // process has it open (the attach above refuses that case).
        let is_wal = inspect(path)?;
        if !is_wal || walrelay_vfs::rollback_journal(path).exists() {
            // Switching to WAL rewrites page 1 through a rollback journal,
            // which the walrelay VFS refuses by design: do it once with the
            // plain unix VFS, before capture begins. A rollback journal
            // beside the database (a crash in that switch, or a writer in
            // rollback mode before walrelay) is rolled back the same way,
            // as SQLite's first read does: the walrelay VFS never opens
            // one. A database already in WAL mode keeps its WAL as it is
            // (no checkpoint on close).
            let c = Connection::open(path).map_err(|e| map_open_error(path, e))?;
            if is_wal {
                c.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
                    .map_err(|e| map_open_error(path, e))?;
            }
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
        let mode: String = crate::sandbox::as_engine(&writer, |c| {
            c.query_row("PRAGMA journal_mode", [], |r| r.get(0))
        })
        .map_err(|e| map_open_error(path, e))?;
        let page_size = crate::sandbox::page_size(&writer).map_err(|e| map_open_error(path, e))?;
        let db_pages = crate::sandbox::page_count(&writer).map_err(|e| map_open_error(path, e))?;
        issuer.db_pages.store(db_pages, Ordering::Relaxed);
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(OpenError::CantOpen {
                path: path_string(path),
                reason: format!("database is not in WAL mode (journal_mode is {mode})"),
            });
        }
        let stopping = Arc::new(AtomicBool::new(false));
        let pooled = |c: Conn| Pooled::new(c, &stopping).map_err(|e| map_open_error(path, e));
        let ro = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let reader = || -> Result<Pooled, OpenError> {
            pooled(configure(open(ro)?, &options, false).map_err(|e| map_open_error(path, e))?)
        };
        let first = reader()?;
        let classifier = reader()?;
        let writer = pooled(writer)?;
        // Readers beyond the first open on demand. The opener keeps no
        // sink or gate (they may hold this database).
        let opener_options = Options {
            sink: None,
            gate: None,
            ..options.clone()
        };
        let opener_path = path.to_path_buf();
        let opener: crate::pool::Opener = Box::new(move || {
            let c = Connection::open_with_flags_and_vfs(&opener_path, ro, walrelay_vfs::VFS_NAME)?;
            configure(c, &opener_options, false)
        });
        attachment.keep_lock_file();
        Ok(Database {
            inner: Arc::new(Inner {
                readers: ReaderPool::new(first, options.readers, opener, Arc::clone(&stopping)),
                classifier: Mutex::new(classifier),
                role: Role::Primary(PrimaryRole {
                    writer: Mutex::new(writer),
                    write_groups: options.group_commit.then(|| {
                        crate::group_write::WriteGroups::new(Duration::from_micros(
                            options.group_commit_delay_us,
                        ))
                    }),
                    issuer,
                    attachment,
                    checkpoint_threshold_frames: options.checkpoint_threshold_frames,
                    gate: options.gate.clone(),
                    max_transaction_bytes: options.limits.max_transaction_bytes,
                    size_limit: crate::sandbox::SizeLimit::new(&options.limits, page_size),
                    growth_frozen: std::sync::atomic::AtomicBool::new(false),
                }),
                path: path.to_path_buf(),
                region: options.region.clone(),
                limits: options.limits,
                stopping,
                long_reads: crate::read_on_worker::LongReads::default(),
                reader_busy_timeout: Duration::from_millis(options.busy_timeout_ms),
            }),
        })
    }

    pub(crate) fn primary(&self) -> Option<&PrimaryRole> {
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

    /// Why capture failed on this primary, if it did: the database then
    /// serves nothing and must not be stopped as clean.
    pub fn capture_failure(&self) -> Option<walrelay_vfs::CaptureError> {
        self.primary().and_then(|p| p.attachment.poisoned())
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
            Role::Primary(p) => checkpoint_on(&p.writer.lock().conn.conn, mode),
            Role::Replica(r) => r.checkpoint(),
        }
    }

    pub(crate) fn meta(&self, started: Instant, bookmark: Bookmark) -> Meta {
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

    pub(crate) fn check_capture(&self) -> Result<(), QueryError> {
        match self.primary().and_then(|p| p.attachment.poisoned()) {
            Some(e) => Err(QueryError::CaptureFailed(e)),
            None => Ok(()),
        }
    }

    /// After a write failed: if capture failed, refused the transaction
    /// for its size, or the database reached its size limit, say so.
    pub(crate) fn explain(&self, e: QueryError) -> QueryError {
        let Some(p) = self.primary() else {
            return e;
        };
        if let Some(poisoned) = p.attachment.poisoned() {
            return QueryError::CaptureFailed(poisoned);
        }
        if p.attachment.take_refused_too_large() {
            tracing::warn!(
                limit_bytes = p.max_transaction_bytes,
                "a write transaction over the size limit was refused before it committed"
            );
            return QueryError::TransactionTooLarge {
                limit_bytes: p.max_transaction_bytes,
            };
        }
        self.explain_full(e)
    }

    /// SQLITE_FULL from a write on a database within one transaction of its
    /// size limit is the size limit (`max_page_count`).
    fn explain_full(&self, e: QueryError) -> QueryError {
        let Some(p) = self.primary() else {
            return e;
        };
        match e {
            QueryError::Batch { index, source } => QueryError::Batch {
                index,
                source: Box::new(self.explain_full(*source)),
            },
            QueryError::Sql {
                code: Some(code), ..
            } if code & 0xff == ffi::SQLITE_FULL && p.growth_frozen.load(Ordering::SeqCst) => {
                QueryError::StorageLimit
            }
            QueryError::Sql {
                code: Some(code), ..
            } if code & 0xff == ffi::SQLITE_FULL
                && p.size_limit
                    .explains_full(p.issuer.db_pages.load(Ordering::Relaxed)) =>
            {
                QueryError::DatabaseFull {
                    max_bytes: p.size_limit.max_bytes,
                }
            }
            e => e,
        }
    }
}
