//! The replica side: applying page sets to a replica's WAL ahead of the
//! commit watermark, and moving the watermark.
//!
//! The applier is the replica's only writer. While any appended transaction
//! is unconfirmed it holds the WAL write lock (lock 0 of `xShmLock`), so no
//! SQLite connection can write, restart or truncate the WAL under it. It
//! writes frames with the replica's own salts and checksum chain (the
//! replica's WAL is not byte-identical to the primary's; its pages are) and
//! fills the wal-index hash tables, but leaves the wal-index header alone:
//! readers ignore every frame past the header's `mxFrame`.
//!
//! `confirm` publishes a new header (copy 1, barrier, copy 0, as SQLite's
//! own writers do) naming the confirmed transaction's last frame: a read
//! transaction that starts afterwards sees the whole transaction, one that
//! started before keeps its snapshot. Nothing else ever changes `mxFrame`.
//!
//! Crash safety rests on one rule, applied on open before SQLite reads the
//! WAL: everything past the persisted watermark is cut, and the wal-index is
//! discarded so SQLite rebuilds it from what is left (see
//! [`crate::watermark`]). The watermark is persisted only after the WAL
//! frames it names are synced, and before a WAL restart makes the old
//! generation unreadable.

mod cut;
mod generation;

use cut::cut_wal;
use generation::{random_u32, salt_bytes};

use crate::attach::{AttachError, Attachment, attach_replica};
use crate::page_set::{FrameNo, PageSet};
use crate::wal_format::{Checksum, FrameHeader, frame_bytes, frame_offset};
use crate::wal_index::{IndexError, IndexHeader, REGION_BYTES, Region, WAL_WRITE_LOCK, region_of};
use crate::watermark::{Watermark, WatermarkError, WatermarkFile, sibling};
use libsqlite3_sys as ffi;
use rusqlite::{Connection, OpenFlags};
use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use walrelay_replicator::Bookmark;

/// Why a replica could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaOpenError {
    #[error("replica I/O on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Watermark(#[from] WatermarkError),
    #[error("replica {path} is inconsistent with its watermark: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error(transparent)]
    Attach(#[from] AttachError),
    #[error("SQLite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("page size {0} is not a power of two in 512..=65536")]
    PageSize(u32),
}

/// Why an append, confirm or discard failed. A failed call changed nothing
/// that readers can see.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("transaction {got} does not follow {after}: send {expected} next")]
    Gap {
        after: Bookmark,
        got: Bookmark,
        expected: Bookmark,
    },
    #[error("cannot confirm {requested}: the newest appended transaction is {last_appended}")]
    NotAppended {
        requested: Bookmark,
        last_appended: Bookmark,
    },
    #[error("page set has page size {got}; this replica's is {expected}")]
    PageSize { expected: u32, got: u32 },
    #[error("an empty page set cannot be applied")]
    EmptyPageSet,
    #[error("timed out waiting for the WAL write lock")]
    Busy,
    #[error("replica WAL I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error(transparent)]
    Watermark(#[from] WatermarkError),
    #[error("SQLite shared-memory call failed with code {0}")]
    Shm(i32),
}

/// What `append` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// Frames written, unconfirmed and invisible.
    Applied {
        first_frame: FrameNo,
        last_frame: FrameNo,
    },
    /// Already appended (or confirmed) before: ignored.
    Duplicate,
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    bookmark: Bookmark,
    /// False for a chunk that a later chunk of its transaction follows:
    /// it holds no commit frame and can never be revealed by itself.
    commits: bool,
    last_frame: u32,
    checksum: Checksum,
    db_pages: u32,
}

/// How to create a replica that does not exist yet.
#[derive(Debug, Clone, Copy)]
pub struct ReplicaInit {
    pub page_size: u32,
    /// The position the initial database file stands for.
    pub bookmark: Bookmark,
}

/// The single writer of one replica database.
pub struct ReplicaWal {
    /// Owns the shared-memory mapping and the file `file` points into; only
    /// ever used through `file`. Declared (so dropped) before the
    /// attachment.
    #[allow(dead_code)]
    conn: Connection,
    /// A separate connection for PASSIVE checkpoints, so that SQLite's own
    /// WAL bookkeeping never shares a connection with the applier's lock.
    ckpt: Connection,
    file: *mut ffi::sqlite3_file,
    attachment: Attachment,
    path: PathBuf,
    wal: File,
    regions: Vec<Region>,
    marks: WatermarkFile,
    page_size: u32,
    /// Salts of the current WAL generation (header bytes 16..24).
    salt: [u8; 8],
    checkpoint_seq: u32,
    /// The current generation's WAL header is on disk.
    generation_started: bool,
    generation_checksum: Checksum,
    next_frame: u32,
    running: Checksum,
    change: u32,
    confirmed: Watermark,
    persisted: Watermark,
    pending: VecDeque<Pending>,
    write_locked: bool,
    lock_timeout: Duration,
    /// Past this many confirmed frames, an append first checkpoints and
    /// restarts the WAL, waiting for readers if it must.
    wal_limit_frames: u32,
    /// fsync the WAL and the watermark when persisting (power-loss safe);
    /// without it they survive process crashes only.
    sync: bool,
}

impl std::fmt::Debug for ReplicaWal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaWal")
            .field("path", &self.path)
            .field("confirmed", &self.confirmed.bookmark)
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

// SAFETY: `file` points into `conn`'s own file object, which moves with the
// ReplicaWal and is only used through `&mut self`; the shm regions are
// process-wide mappings owned by that connection.
unsafe impl Send for ReplicaWal {}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> ReplicaOpenError + '_ {
    move |source| ReplicaOpenError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A database's rollback journal: a walrelay database never has one (the
/// VFS refuses to open it); one found beside a database was left by a cut
/// in rollback mode, before the database was in WAL mode.
pub fn rollback_journal(db: &Path) -> PathBuf {
    sibling(db, "-journal")
}

/// Every file a replica database consists of: the database, its WAL, its
/// wal-index and its watermark.
pub fn replica_files(db: &Path) -> [PathBuf; 4] {
    [
        db.to_path_buf(),
        sibling(db, "-wal"),
        sibling(db, "-shm"),
        WatermarkFile::path_for(db),
    ]
}

/// Every file a closed replica leaves, its owner lock file included:
/// what removing a replica for good removes.
pub fn closed_replica_files(db: &Path) -> [PathBuf; 5] {
    let [a, b, c, d] = replica_files(db);
    [a, b, c, d, crate::owner_lock::lock_path(db)]
}

impl ReplicaWal {
    /// Opens the replica at `path`, creating it from `init` if it does not
    /// exist. Before SQLite sees the WAL, everything past the persisted
    /// watermark is cut. No other connection in this process may have the
    /// database open (attach refuses a second opener).
    pub fn open(path: &Path, init: ReplicaInit) -> Result<ReplicaWal, ReplicaOpenError> {
        if !(512..=65536).contains(&init.page_size) || !init.page_size.is_power_of_two() {
            return Err(ReplicaOpenError::PageSize(init.page_size));
        }
        // Attach before touching any file of the database (closing a
        // descriptor would drop this process's POSIX locks on it).
        let attachment = attach_replica(path)?;
        let mark_exists = WatermarkFile::path_for(path).exists();
        let wal_len = std::fs::metadata(sibling(path, "-wal")).map_or(0, |m| m.len());
        // A cut while a new replica's database was switched to WAL (below,
        // through a rollback journal) leaves a hot journal beside it, and
        // the walrelay VFS never opens one. Only then, with no WAL and no
        // watermark yet, is the journal rolled back, through SQLite's own
        // VFS: the database goes back to empty and the replica starts
        // again. With a WAL, the open is refused as it was: a rollback
        // that emptied the database would let SQLite delete that WAL.
        if wal_len == 0 && !mark_exists && rollback_journal(path).exists() {
            let c = Connection::open(path)?;
            let _: i64 = c.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))?;
            c.close().map_err(|(_, e)| e)?;
        }
        let fresh = std::fs::metadata(path)
            .map(|m| m.len() == 0)
            .unwrap_or(true);
        // No database file but the rest of a replica is there: its data
        // was lost, not never written. Creating a new database would let
        // SQLite delete the WAL that may hold the durable transactions, so
        // refuse and leave every file as it is.
        if fresh && (wal_len > 0 || mark_exists) {
            return Err(ReplicaOpenError::Corrupt {
                path: path.to_path_buf(),
                reason: "the database file is missing or empty but its WAL or watermark exists"
                    .into(),
            });
        }
        if fresh {
            let c = Connection::open(path)?;
            c.execute_batch(&format!(
                "PRAGMA page_size={}; PRAGMA journal_mode=WAL;",
                init.page_size
            ))?;
            c.close().map_err(|(_, e)| e)?;
        }
        let db_len = std::fs::metadata(path).map_err(io_err(path))?.len();
        let initial = Watermark {
            bookmark: init.bookmark,
            salt: [0; 8],
            frame: 0,
            checksum: Checksum::default(),
            db_pages: (db_len / u64::from(init.page_size)) as u32,
            page_size: init.page_size,
        };
        let (marks, mark) = WatermarkFile::open(&WatermarkFile::path_for(path), initial)?;
        let wal_path = sibling(path, "-wal");
        let cut = cut_wal(path, &wal_path, &mark)?;
        // Force SQLite to rebuild the wal-index from the cut WAL.
        if let Ok(f) = OpenOptions::new().write(true).open(sibling(path, "-shm")) {
            f.set_len(0).map_err(io_err(path))?;
        }

        let conn = open_rw(path)?;
        // A read transaction makes SQLite open the WAL and build the index.
        let _: i64 = conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))?;
        // Only a connection SQLite runs in WAL mode unmaps the wal-index
        // when it closes: mapping it on any other (a damaged database file
        // that reads as a rollback-mode one) would leak the mapping and its
        // descriptor on every attempt.
        let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(ReplicaOpenError::Corrupt {
                path: path.to_path_buf(),
                reason: format!("the database is not in WAL mode (journal_mode {mode})"),
            });
        }
        let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
        // SAFETY: the handle is live; FILE_POINTER writes one pointer to
        // the main database's sqlite3_file into `file`.
        let rc = unsafe {
            ffi::sqlite3_file_control(
                conn.handle(),
                c"main".as_ptr(),
                ffi::SQLITE_FCNTL_FILE_POINTER,
                (&raw mut file).cast::<c_void>(),
            )
        };
        if rc != ffi::SQLITE_OK || file.is_null() {
            return Err(ReplicaOpenError::Corrupt {
                path: path.to_path_buf(),
                reason: format!("no file pointer (SQLite code {rc})"),
            });
        }
        let ckpt = open_rw(path)?;
        // The checkpoint syncs the database file before the WAL restarts,
        // which the restart's watermark relies on.
        ckpt.execute_batch("PRAGMA wal_autocheckpoint=0; PRAGMA synchronous=NORMAL;")?;
        let wal = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&wal_path)
            .map_err(io_err(&wal_path))?;
        let mut r = ReplicaWal {
            conn,
            ckpt,
            file,
            attachment,
            path: path.to_path_buf(),
            wal,
            regions: Vec::new(),
            marks,
            page_size: mark.page_size,
            salt: cut.map_or([0; 8], |h| salt_bytes(&h)),
            checkpoint_seq: cut.map_or(0, |h| h.checkpoint_seq),
            generation_started: cut.is_some(),
            generation_checksum: cut.map_or(Checksum::default(), |h| h.checksum),
            next_frame: mark.frame + 1,
            running: if mark.frame > 0 {
                mark.checksum
            } else {
                cut.map_or(Checksum::default(), |h| h.checksum)
            },
            change: 0,
            confirmed: mark,
            persisted: mark,
            pending: VecDeque::new(),
            write_locked: false,
            lock_timeout: Duration::from_secs(5),
            wal_limit_frames: 4096,
            sync: true,
        };
        let header = r.read_index_header()?;
        let seen = header.map_or(0, |h| h.max_frame);
        if seen != mark.frame {
            return Err(ReplicaOpenError::Corrupt {
                path: path.to_path_buf(),
                reason: format!(
                    "after recovery the WAL holds {seen} frames, the watermark names {}",
                    mark.frame
                ),
            });
        }
        r.change = header.map_or(0, |h| h.change);
        r.attachment.keep_lock_file();
        Ok(r)
    }

    /// The newest confirmed transaction.
    pub fn confirmed(&self) -> Bookmark {
        self.confirmed.bookmark
    }

    /// The newest appended transaction (confirmed or not).
    pub fn last_appended(&self) -> Bookmark {
        self.pending
            .back()
            .map_or(self.confirmed.bookmark, |p| p.bookmark)
    }

    /// What confirming `bookmark` would reveal: the newest whole appended
    /// transaction at or before it (or the confirmed one).
    pub fn revealed_by(&self, bookmark: Bookmark) -> Bookmark {
        self.pending
            .iter()
            .rev()
            .find(|p| p.commits && p.bookmark <= bookmark)
            .map_or(self.confirmed.bookmark, |p| p.bookmark)
    }

    /// The newest watermark that is durable on disk.
    pub fn persisted(&self) -> Bookmark {
        self.persisted.bookmark
    }

    pub fn page_size(&self) -> u32 {
        self.page_size
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Frames in the current WAL generation (confirmed and not).
    pub fn wal_frames(&self) -> u32 {
        self.next_frame - 1
    }

    fn region(&mut self, index: usize) -> Result<Region, ApplyError> {
        while self.regions.len() <= index {
            let i = self.regions.len();
            let mut p: *mut c_void = std::ptr::null_mut();
            // SAFETY: `file` is the live main-db file of `conn`; xShmMap maps
            // region `i` of REGION_BYTES (extending the file if needed) and
            // keeps it mapped until the connection unmaps it at close.
            let rc = unsafe {
                let m = &*(*self.file).pMethods;
                match m.xShmMap {
                    Some(map) => map(self.file, i as c_int, REGION_BYTES as c_int, 1, &mut p),
                    None => ffi::SQLITE_IOERR_SHMMAP,
                }
            };
            if rc != ffi::SQLITE_OK || p.is_null() {
                return Err(ApplyError::Shm(rc));
            }
            // SAFETY: SQLite's shm regions are page-aligned, REGION_BYTES
            // long, and stay mapped while `conn` is open (it outlives the
            // Region values, which live in `self`).
            self.regions.push(unsafe { Region::new(p.cast(), i) });
        }
        Ok(self.regions[index])
    }

    fn read_index_header(&mut self) -> Result<Option<IndexHeader>, ReplicaOpenError> {
        let r = self.region(0).map_err(|e| ReplicaOpenError::Corrupt {
            path: self.path.clone(),
            reason: e.to_string(),
        })?;
        let w0 = r.read_header_words(0);
        Ok(IndexHeader::from_words(&w0))
    }

    fn shm_lock(&self, ofst: c_int, n: c_int, flags: c_int) -> c_int {
        // SAFETY: `file` is the live main-db file of `conn`.
        unsafe {
            match (*(*self.file).pMethods).xShmLock {
                Some(lock) => lock(self.file, ofst, n, flags),
                None => ffi::SQLITE_IOERR_SHMLOCK,
            }
        }
    }

    fn lock_writer(&mut self) -> Result<(), ApplyError> {
        if self.write_locked {
            return Ok(());
        }
        let deadline = Instant::now() + self.lock_timeout;
        let mut backoff = Duration::from_micros(10);
        loop {
            let rc = self.shm_lock(
                WAL_WRITE_LOCK,
                1,
                ffi::SQLITE_SHM_LOCK | ffi::SQLITE_SHM_EXCLUSIVE,
            );
            match rc {
                ffi::SQLITE_OK => {
                    self.write_locked = true;
                    return Ok(());
                }
                ffi::SQLITE_BUSY if Instant::now() < deadline => {
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(5));
                }
                ffi::SQLITE_BUSY => return Err(ApplyError::Busy),
                rc => return Err(ApplyError::Shm(rc)),
            }
        }
    }

    fn unlock_writer(&mut self) {
        if self.write_locked {
            self.shm_lock(
                WAL_WRITE_LOCK,
                1,
                ffi::SQLITE_SHM_UNLOCK | ffi::SQLITE_SHM_EXCLUSIVE,
            );
            self.write_locked = false;
        }
    }

    /// Writes `pages` as transaction `bookmark` past the watermark, where no
    /// reader looks. A bookmark at or before the newest appended one is a
    /// duplicate and is ignored; one that skips ahead is a `Gap` naming the
    /// transaction to send next.
    pub fn append(&mut self, bookmark: Bookmark, pages: &PageSet) -> Result<Appended, ApplyError> {
        self.append_chunk(bookmark, pages, true)
    }

    /// As [`ReplicaWal::append`], for one chunk of a transaction that
    /// travels as several: `commits` is true only for its last chunk, whose
    /// last frame carries the commit. Chunks before it are written without
    /// a commit frame and a confirm never reveals them by themselves (it
    /// stops at the newest whole transaction it covers).
    pub fn append_chunk(
        &mut self,
        bookmark: Bookmark,
        pages: &PageSet,
        commits: bool,
    ) -> Result<Appended, ApplyError> {
        let last = self.last_appended();
        if bookmark <= last {
            return Ok(Appended::Duplicate);
        }
        let follows = if bookmark.epoch == last.epoch {
            Some(bookmark) == last.next()
        } else {
            bookmark.epoch > last.epoch && bookmark.sequence.0 == 1
        };
        if !follows {
            let expected = last.next().unwrap_or(last);
            return Err(ApplyError::Gap {
                after: last,
                got: bookmark,
                expected,
            });
        }
        if pages.page_size() != self.page_size {
            return Err(ApplyError::PageSize {
                expected: self.page_size,
                got: pages.page_size(),
            });
        }
        if pages.is_empty() {
            return Err(ApplyError::EmptyPageSet);
        }
        self.lock_writer()?;
        let result = self.write_frames(bookmark, pages, commits);
        if result.is_err() && self.pending.is_empty() {
            self.unlock_writer();
        }
        result
    }

    fn write_frames(
        &mut self,
        bookmark: Bookmark,
        pages: &PageSet,
        commits: bool,
    ) -> Result<Appended, ApplyError> {
        self.maybe_restart()?;
        if !self.generation_started {
            self.start_generation(random_u32())?;
        }
        let wal = self.wal_header();
        let first = self.next_frame;
        let fb = frame_bytes(self.page_size) as usize;
        let n = pages.len();
        let mut buf = Vec::with_capacity(n * fb);
        let mut ck = self.running;
        for (i, (no, image)) in pages.pages().iter().enumerate() {
            let commit = if commits && i + 1 == n {
                pages.db_size_pages()
            } else {
                0
            };
            let (h, next) = FrameHeader::encode(&wal, *no, commit, ck, image);
            buf.extend_from_slice(&h);
            buf.extend_from_slice(image);
            ck = next;
        }
        self.wal
            .write_all_at(&buf, frame_offset(self.page_size, FrameNo::new(first)))?;
        for (i, (no, _)) in pages.pages().iter().enumerate() {
            let frame = first + i as u32;
            let (region, zero) = region_of(frame);
            self.region(region)?.append(frame, zero, no.get())?;
        }
        let last = first + n as u32 - 1;
        self.next_frame = last + 1;
        self.running = ck;
        self.pending.push_back(Pending {
            bookmark,
            commits,
            last_frame: last,
            checksum: ck,
            db_pages: pages.db_size_pages(),
        });
        Ok(Appended::Applied {
            first_frame: FrameNo::new(first),
            last_frame: FrameNo::new(last),
        })
    }

    /// Makes every appended transaction up to `bookmark` visible at once to
    /// read transactions that start from now on. Confirming what is already
    /// confirmed is a no-op; confirming what was never appended is an error.
    /// A bookmark inside a chunked transaction reveals only the whole
    /// transactions before it.
    pub fn confirm(&mut self, bookmark: Bookmark) -> Result<(), ApplyError> {
        if bookmark <= self.confirmed.bookmark {
            return Ok(());
        }
        if bookmark > self.last_appended() {
            return Err(ApplyError::NotAppended {
                requested: bookmark,
                last_appended: self.last_appended(),
            });
        }
        let Some(idx) = self
            .pending
            .iter()
            .rposition(|p| p.commits && p.bookmark <= bookmark)
        else {
            return Ok(()); // only chunks of an unfinished transaction
        };
        let p = self.pending[idx];
        let region0 = self.region(0)?;
        self.change = self.change.wrapping_add(1);
        region0.publish_header(&self.index_header(p.last_frame, p.db_pages, p.checksum));
        self.pending.drain(..=idx);
        self.confirmed = Watermark {
            bookmark: p.bookmark,
            salt: self.salt,
            frame: p.last_frame,
            checksum: p.checksum,
            db_pages: p.db_pages,
            page_size: self.page_size,
        };
        if self.pending.is_empty() {
            self.unlock_writer();
        }
        Ok(())
    }

    /// Drops every unconfirmed transaction (a new primary's log replaces
    /// them). Readers never saw them; the next append reuses their frames.
    pub fn discard_unconfirmed(&mut self) -> Result<(), ApplyError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.pending.clear();
        let frame = if self.confirmed.salt == self.salt {
            self.confirmed.frame
        } else {
            0
        };
        self.next_frame = frame + 1;
        self.running = if frame > 0 {
            self.confirmed.checksum
        } else {
            self.generation_checksum
        };
        if frame > 0 {
            let (region, zero) = region_of(frame);
            self.region(region)?.clear_from((frame - zero) as usize);
        }
        self.unlock_writer();
        Ok(())
    }

    /// Makes the confirmed watermark durable: syncs the WAL, then records
    /// the watermark. Until this runs, a crash may roll the replica back to
    /// the previous durable watermark (never past a confirmed transaction
    /// to an unconfirmed one).
    pub fn persist(&mut self) -> Result<(), ApplyError> {
        if self.persisted == self.confirmed {
            return Ok(());
        }
        if self.sync {
            self.wal.sync_data()?;
        }
        self.marks.store_with(&self.confirmed, self.sync)?;
        self.persisted = self.confirmed;
        Ok(())
    }

    /// Whether persisting fsyncs (the default). Off, the replica is like a
    /// SQLite database at `synchronous=OFF`: a process crash loses nothing
    /// persisted, a power loss may lose the newest persisted watermarks
    /// (never expose an unconfirmed frame: the cut on open still applies,
    /// and a watermark naming frames that did not reach the disk is
    /// refused as corrupt rather than trusted).
    pub fn set_sync(&mut self, sync: bool) -> Result<(), ApplyError> {
        self.sync = sync;
        let mode = if sync { "NORMAL" } else { "OFF" };
        self.ckpt
            .execute_batch(&format!("PRAGMA synchronous={mode};"))
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(())
    }

    /// Bounds the WAL: once it holds `frames` confirmed frames, the next
    /// append (with nothing unconfirmed) checkpoints and restarts it first.
    /// Unconfirmed frames cannot be restarted away, so the WAL holds at
    /// most this bound plus the unconfirmed window plus one transaction.
    pub fn set_wal_limit(&mut self, frames: u32) {
        self.wal_limit_frames = frames.max(1);
    }

    /// Copies confirmed frames into the database file (PASSIVE: never waits
    /// for readers, never touches an unconfirmed frame, since SQLite
    /// checkpoints only up to the wal-index `mxFrame`). Once everything is
    /// copied and no reader uses the WAL, the next append restarts the WAL
    /// at frame 1, which keeps it bounded. Returns (frames in the WAL,
    /// frames backfilled).
    pub fn checkpoint(&mut self) -> Result<(u32, u32), ApplyError> {
        // The database file must never hold a page of a transaction past
        // the durable watermark: after a crash the WAL is cut back to that
        // watermark, and a newer page already in the file would mix two
        // states. So the watermark catches up with what the checkpoint may
        // copy (everything confirmed) first.
        self.persist()?;
        let (mut log, mut done) = (0, 0);
        // SAFETY: `ckpt` is a live connection owned by self; the schema name
        // is NUL-terminated; the out-pointers are valid locals.
        let rc = unsafe {
            ffi::sqlite3_wal_checkpoint_v2(
                self.ckpt.handle(),
                c"main".as_ptr(),
                ffi::SQLITE_CHECKPOINT_PASSIVE,
                &mut log,
                &mut done,
            )
        };
        match rc {
            ffi::SQLITE_OK | ffi::SQLITE_BUSY => Ok((log.max(0) as u32, done.max(0) as u32)),
            rc => Err(ApplyError::Shm(rc)),
        }
    }

    /// The attachment this replica holds (for opening reader connections).
    pub fn attachment(&self) -> &Attachment {
        &self.attachment
    }
}

impl Drop for ReplicaWal {
    fn drop(&mut self) {
        self.unlock_writer();
    }
}

/// A read-write connection of the replica through the walrelay VFS (which
/// still refuses it any WAL write); never checkpoints on close.
fn open_rw(path: &Path) -> Result<Connection, rusqlite::Error> {
    let c = Connection::open_with_flags_and_vfs(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        crate::VFS_NAME,
    )?;
    c.busy_timeout(Duration::from_secs(5))?;
    c.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
        true,
    )?;
    Ok(c)
}
