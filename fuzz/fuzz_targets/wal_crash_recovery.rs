//! WAL crash recovery of a replica and of a primary.
//!
//! Once per process, valid base states are built through the public APIs
//! (a capturing primary produces the page sets; `ReplicaWal` applies them):
//! replicas with transactions persisted, confirmed-not-persisted,
//! unconfirmed and half-chunked, before and after a checkpoint and a WAL
//! restart, and primaries with and without a checkpoint. Transaction `k`
//! writes marker `k` (a row of `t` and `meta.last`), so a reader can tell
//! exactly which whole transactions it sees.
//!
//! Each input picks a base state and a list of crash mutations, applied to
//! a copy of its files: truncations and torn ranges (zeros or garbage) of
//! the WAL and the database file, torn WAL frames and database pages,
//! garbage `-shm`, torn, stale (an earlier persisted image) or forged
//! (well-formed, CRC-valid) watermark files, deleted files. The state is
//! then opened through the normal open path (`ReplicaWal::open`; for a
//! primary, `attach` and a connection through the walrelay VFS).
//!
//! Properties:
//! - opening never panics; failing is fine only as a typed error;
//! - no execution leaves a rollback journal beside the database;
//! - a replica whose watermark file yields the durable watermark `D`
//!   persisted before the mutations, whose WAL is intact through `D`'s
//!   commit frame, and whose database file differs only in pages that a
//!   checkpoint could have been writing (pages held by WAL frames up to
//!   `D`, or past the database's end), is a crash state: it must open,
//!   show exactly transaction `D`, pass `PRAGMA integrity_check`, and take
//!   the next transaction (append, confirm, checkpoint, persist, and find
//!   it again after a reopen);
//! - whatever else was done to it, an opened replica whose database file is
//!   intact (in the sense above) never shows a marker past `D`, and when its
//!   watermark file yields an earlier persisted watermark that the database
//!   file does not run ahead of, it shows exactly that watermark's
//!   transaction; a watermark file that cannot be read is never opened;
//! - a primary (every commit synced, `synchronous=FULL`) with its database
//!   file intact in the same sense must open showing exactly the newest
//!   whole transaction in the intact prefix of its WAL, pass
//!   `integrity_check`, and capture its next transaction as a page set
//!   that reproduces the database.
//!
//! Forged watermarks and damaged database pages that nothing covers are
//! media corruption, not crashes: for them only the first property holds.
#![no_main]

#[path = "wal_crash_recovery/base.rs"]
mod base;
#[path = "wal_crash_recovery/check.rs"]
mod check;
#[path = "wal_crash_recovery/mutate.rs"]
mod mutate;
#[path = "wal_crash_recovery/sqlite_log.rs"]
mod sqlite_log;

use base::*;
use check::*;
use mutate::*;

use libfuzzer_sys::fuzz_target;
use rusqlite::{Connection, OpenFlags, OptionalExtension, ffi};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use walrelay_replicator::{Bookmark, Epoch, Sequence};
use walrelay_vfs::wal_format::{
    FRAME_HEADER_BYTES, FrameHeader, WAL_HEADER_BYTES, WalHeader, frame_bytes, frame_offset,
};
use walrelay_vfs::watermark::{Watermark, WatermarkFile};
use walrelay_vfs::{
    Appended, CaptureSink, CapturedTransaction, FrameNo, PageSet, ReplicaInit, ReplicaWal,
    SinkError, VFS_NAME, attach, replica_files, rollback_journal,
};

const PAGE_SIZE: u32 = 512;
const PS: usize = PAGE_SIZE as usize;
/// Transactions the source primary commits (replicas use up to 7).
const TXNS: u64 = 8;
const MAX_OPS: usize = 8;
/// Files of a state: database, WAL, wal-index, watermark.
const DB: usize = 0;
const WAL: usize = 1;
const SHM: usize = 2;
const MARK: usize = 3;

type Files = [Option<Vec<u8>>; 4];

// ------------------------------------------------------------ transactions

fn pad_len(k: u64) -> u64 {
    2 * (60 + 23 * (k % 7))
}

/// Transaction `k`: the schema and `meta.last = 1`, then one row `k` of
/// `t` and `meta.last = k`.
fn txn_sql(k: u64) -> String {
    if k == 1 {
        "BEGIN; CREATE TABLE meta(id INTEGER PRIMARY KEY, last INTEGER NOT NULL); \
         CREATE TABLE t(k INTEGER PRIMARY KEY, pad TEXT NOT NULL); \
         INSERT INTO meta VALUES (1, 1); COMMIT;"
            .into()
    } else {
        format!(
            "BEGIN; INSERT INTO t VALUES ({k}, replace(hex(zeroblob({})), '0', char({}))); \
             UPDATE meta SET last = {k} WHERE id = 1; COMMIT;",
            pad_len(k) / 2,
            65 + k % 26
        )
    }
}

/// What a reader sees.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// Exactly the state after transaction `j` (0: the empty database).
    Whole(u64),
    /// Anything else; the largest marker visible.
    Mixed { max_marker: u64, why: String },
}

fn seen(c: &Connection) -> rusqlite::Result<Seen> {
    let all: i64 = c.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))?;
    if all == 0 {
        return Ok(Seen::Whole(0));
    }
    let tables: i64 = c.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('t', 'meta')",
        [],
        |r| r.get(0),
    )?;
    if tables != 2 || all != 2 {
        return Ok(Seen::Mixed {
            max_marker: 0,
            why: format!("schema has {all} entries, {tables} of t and meta"),
        });
    }
    let last: Option<i64> = c
        .query_row("SELECT last FROM meta WHERE id = 1", [], |r| r.get(0))
        .optional()?;
    let (n, max_k, sum_k, sum_len, bad): (i64, Option<i64>, i64, i64, i64) = c.query_row(
        "SELECT count(*), max(k), coalesce(sum(k), 0), coalesce(sum(length(pad)), 0), \
         coalesce(sum(substr(pad, 1, 1) <> char(65 + k % 26)), 0) FROM t",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
    )?;
    let max_marker = last.unwrap_or(0).max(max_k.unwrap_or(0)).max(0) as u64;
    if let Some(j) = last.filter(|&j| j >= 1) {
        let j = j as u64;
        let want_sum: u64 = (2..=j).sum();
        let want_len: u64 = (2..=j).map(pad_len).sum();
        if n as u64 == j - 1
            && max_k.map(|m| m as u64) == (j >= 2).then_some(j)
            && sum_k as u64 == want_sum
            && sum_len as u64 == want_len
            && bad == 0
        {
            return Ok(Seen::Whole(j));
        }
    }
    Ok(Seen::Mixed {
        max_marker,
        why: format!(
            "meta.last {last:?}, {n} rows, max {max_k:?}, sum {sum_k}, len {sum_len}, bad {bad}"
        ),
    })
}

fn integrity(c: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut s = c.prepare("PRAGMA integrity_check")?;
    s.query_map([], |r| r.get::<_, String>(0))?.collect()
}

fn integrity_ok(c: &Connection) -> bool {
    integrity(c).is_ok_and(|v| v == ["ok"])
}

fn bm(seq: u64) -> Bookmark {
    if seq == 0 {
        Bookmark::ZERO
    } else {
        Bookmark::new(Epoch(1), Sequence(seq))
    }
}

#[derive(Default)]
struct Recorder(Mutex<Vec<CapturedTransaction>>);
impl CaptureSink for Recorder {
    fn committed(&self, txn: CapturedTransaction) -> Result<(), SinkError> {
        self.0.lock().expect("recorder").push(txn);
        Ok(())
    }
}

fn open_vfs(path: &Path, flags: OpenFlags) -> rusqlite::Result<Connection> {
    let c = Connection::open_with_flags_and_vfs(
        path,
        flags | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        VFS_NAME,
    )?;
    c.busy_timeout(std::time::Duration::from_millis(200))?;
    c.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
        true,
    )?;
    Ok(c)
}

/// Deterministic salts and random blobs, so that an input replays.
fn seed_prng() {
    // SAFETY: PRNG_SEED takes (int seed, sqlite3 *db); a null db is allowed.
    unsafe {
        ffi::sqlite3_test_control(
            ffi::SQLITE_TESTCTRL_PRNG_SEED,
            0x5eed as std::ffi::c_int,
            std::ptr::null_mut::<ffi::sqlite3>(),
        );
    }
}

// ------------------------------------------------------------ target

/// Open descriptors of this process, when `WALRELAY_FUZZ_FDS=1` asks for
/// the leak check (an execution must close every file it opened).
fn open_fds() -> Option<usize> {
    static ON: OnceLock<bool> = OnceLock::new();
    if !*ON.get_or_init(|| std::env::var_os("WALRELAY_FUZZ_FDS").is_some()) {
        return None;
    }
    Some(std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count()))
}

fuzz_target!(|data: &[u8]| {
    sqlite_log::install();
    let base = BASE.get_or_init(build);
    let fds = open_fds();
    seed_prng();
    sqlite_log::clear();
    let mut input = Input(data);
    let pick = usize::from(input.byte().unwrap_or(0)) % base.scenarios.len();
    let sc = &base.scenarios[pick];
    let files = mutate(base, sc, &mut input);
    let db = match sc.role {
        Role::Replica { .. } => {
            let db = base.run.join("replica.db");
            write_files(&db, &files);
            check_replica(base, sc, &files);
            db
        }
        Role::Primary => {
            let db = base.run.join("primary.db");
            write_files(&db, &files);
            check_primary(base, sc, &files);
            db
        }
    };
    // A walrelay database never gets a rollback journal: one left behind
    // (by a write SQLite made in rollback mode on a damaged header) made
    // the next state's open fail (papers/fuzz-crash-recovery.md).
    assert!(
        !rollback_journal(&db).exists(),
        "{}: a rollback journal was left behind; {}",
        sc.name,
        changes(sc, &files)
    );
    if let (Some(before), Some(after)) = (fds, open_fds()) {
        assert!(
            after <= before,
            "{}: {} descriptors left open ({before} before, {after} after); {}",
            sc.name,
            after - before,
            changes(sc, &files)
        );
    }
});
