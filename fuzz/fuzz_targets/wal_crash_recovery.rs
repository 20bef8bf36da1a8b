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
    SinkError, VFS_NAME, attach, replica_files,
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

// ------------------------------------------------------------ base states

/// A WAL's current generation: its salts and its valid frames (page
/// number, database size after a commit frame or 0), in order, up to the
/// first frame that breaks the chain.
#[derive(Debug, Clone, Default)]
struct WalScan {
    salt: Option<[u8; 8]>,
    frames: Vec<(u32, u32)>,
}

fn scan_wal(bytes: &[u8]) -> WalScan {
    let Some(Ok(h)) = bytes.get(..WAL_HEADER_BYTES).map(WalHeader::decode) else {
        return WalScan::default();
    };
    let mut salt = [0u8; 8];
    salt.copy_from_slice(&bytes[16..24]);
    let fb = frame_bytes(h.page_size) as usize;
    let mut prev = h.checksum;
    let mut frames = Vec::new();
    loop {
        let n = frames.len() as u32 + 1;
        let off = frame_offset(h.page_size, FrameNo::new(n)) as usize;
        let Some(frame) = bytes.get(off..off + fb) else {
            break;
        };
        let mut hb = [0u8; FRAME_HEADER_BYTES];
        hb.copy_from_slice(&frame[..FRAME_HEADER_BYTES]);
        let fh = FrameHeader::decode(&hb);
        match fh.validate(&h, FrameNo::new(n), prev, &hb, &frame[FRAME_HEADER_BYTES..]) {
            Ok(ck) => {
                prev = ck;
                frames.push((fh.page_no, fh.commit_db_pages));
            }
            Err(_) => break,
        }
    }
    WalScan {
        salt: Some(salt),
        frames,
    }
}

impl WalScan {
    /// Pages of the frames up to the last commit frame at or before
    /// `limit`, and that commit frame (0: none).
    fn cover(&self, limit: usize) -> (BTreeSet<u32>, usize) {
        let limit = limit.min(self.frames.len());
        let Some(c) = (1..=limit).rev().find(|&i| self.frames[i - 1].1 != 0) else {
            return (BTreeSet::new(), 0);
        };
        (self.frames[..c].iter().map(|f| f.0).collect(), c)
    }

    fn commits_through(&self, frame: usize) -> u64 {
        self.frames[..frame].iter().filter(|f| f.1 != 0).count() as u64
    }
}

enum Role {
    Replica {
        /// The watermark the base state's file yields.
        durable: Watermark,
        /// Every watermark that was persisted while building, with the
        /// transaction it stands for.
        history: Vec<(Watermark, u64)>,
        /// The watermark file as it was after each persist.
        snapshots: Vec<Vec<u8>>,
    },
    Primary,
}

struct Scenario {
    name: &'static str,
    role: Role,
    files: Files,
    scan: WalScan,
    /// Transaction of the durable state.
    durable_state: u64,
    /// Frames of the WAL's generation that the durable state needs.
    durable_frame: usize,
    /// Newest transaction the database file may hold pages of.
    db_state: u64,
}

struct Base {
    run: PathBuf,
    scratch: PathBuf,
    /// `txns[k - 1]` turns state `k - 1` into state `k`.
    txns: Vec<PageSet>,
    scenarios: Vec<Scenario>,
}

fn read_files(db: &Path) -> Files {
    replica_files(db).map(|p| std::fs::read(p).ok())
}

fn write_files(db: &Path, files: &Files) {
    for (p, f) in replica_files(db).iter().zip(files) {
        match std::fs::remove_file(p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("remove {}: {e}", p.display()),
        }
        if let Some(bytes) = f {
            std::fs::write(p, bytes).expect("write state file");
        }
    }
}

/// The watermark a watermark file's bytes yield, as `ReplicaWal::open`
/// would read it (`None`: the file is missing or empty, so open starts
/// over at its initial watermark; `Some(Err)`: it cannot be read).
fn read_mark(scratch: &Path, bytes: Option<&[u8]>) -> Option<Result<Watermark, String>> {
    let bytes = bytes.filter(|b| !b.is_empty())?;
    let p = scratch.join("mark");
    std::fs::write(&p, bytes).expect("scratch mark");
    let dummy = Watermark {
        bookmark: Bookmark::ZERO,
        salt: [0; 8],
        frame: 0,
        checksum: Default::default(),
        db_pages: 0,
        page_size: PAGE_SIZE,
    };
    Some(
        WatermarkFile::open(&p, dummy)
            .map(|(_, m)| m)
            .map_err(|e| e.to_string()),
    )
}

fn primary_conn(db: &Path) -> (walrelay_vfs::Attachment, Connection, Arc<Recorder>) {
    {
        let c = Connection::open(db).expect("create primary");
        c.execute_batch(&format!(
            "PRAGMA page_size={PAGE_SIZE}; PRAGMA journal_mode=WAL;"
        ))
        .expect("wal");
    }
    let rec = Arc::new(Recorder::default());
    let att = attach(db, rec.clone()).expect("attach primary");
    let c = open_vfs(db, OpenFlags::SQLITE_OPEN_READ_WRITE).expect("open primary");
    c.execute_batch("PRAGMA wal_autocheckpoint=0; PRAGMA synchronous=FULL;")
        .expect("pragmas");
    (att, c, rec)
}

fn checkpoint(c: &Connection) {
    let (mut log, mut done) = (0, 0);
    // SAFETY: a live handle, a NUL-terminated schema name, valid outs.
    let rc = unsafe {
        ffi::sqlite3_wal_checkpoint_v2(
            c.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_CHECKPOINT_PASSIVE,
            &mut log,
            &mut done,
        )
    };
    assert_eq!(rc, ffi::SQLITE_OK, "checkpoint");
    assert_eq!(log, done, "whole WAL checkpointed");
}

fn primary_scenario(name: &'static str, files: Files, durable: u64, db_state: u64) -> Scenario {
    let scan = scan_wal(files[WAL].as_deref().unwrap_or_default());
    let durable_frame = scan
        .frames
        .iter()
        .rposition(|f| f.1 != 0)
        .map_or(0, |i| i + 1);
    assert_eq!(
        db_state + scan.commits_through(durable_frame),
        durable,
        "{name}: WAL commits"
    );
    Scenario {
        name,
        role: Role::Primary,
        files,
        scan,
        durable_state: durable,
        durable_frame,
        db_state,
    }
}

/// The source primary: its page sets, and a crash image after 6
/// transactions with everything in the WAL.
fn build_primaries(dir: &Path) -> (Vec<PageSet>, Vec<Scenario>) {
    let mut out = Vec::new();
    let db = dir.join("source.db");
    let (att, c, rec) = primary_conn(&db);
    for k in 1..=TXNS {
        c.execute_batch(&txn_sql(k)).expect("source txn");
        if k == 6 {
            out.push(primary_scenario("primary", read_files(&db), 6, 0));
        }
    }
    assert_eq!(seen(&c).expect("source"), Seen::Whole(TXNS));
    drop(c);
    assert!(att.poisoned().is_none());
    drop(att);
    let txns: Vec<PageSet> = rec
        .0
        .lock()
        .expect("recorder")
        .iter()
        .map(|t| t.pages.clone())
        .collect();
    assert_eq!(txns.len() as u64, TXNS);

    // Checkpointed after 3, then 4..6 in a restarted WAL (whose tail still
    // holds frames of the previous generation).
    let db = dir.join("ckpt.db");
    let (att, c, _rec) = primary_conn(&db);
    for k in 1..=6 {
        c.execute_batch(&txn_sql(k)).expect("txn");
        if k == 3 {
            checkpoint(&c);
        }
    }
    out.push(primary_scenario(
        "primary-checkpointed",
        read_files(&db),
        6,
        3,
    ));
    drop(c);
    drop(att);
    (txns, out)
}

enum Step {
    Append(u64),
    /// The first half of transaction `k`'s pages as a non-final chunk.
    Chunk(u64),
    Confirm(u64),
    Persist,
    Checkpoint,
}

fn build_replica(
    dir: &Path,
    scratch: &Path,
    name: &'static str,
    txns: &[PageSet],
    steps: &[Step],
    db_state: u64,
) -> Scenario {
    let db = dir.join(format!("{name}.db"));
    let mark_path = WatermarkFile::path_for(&db);
    let mut history: Vec<(Watermark, u64)> = Vec::new();
    let mut snapshots: Vec<Vec<u8>> = Vec::new();
    let record = |history: &mut Vec<(Watermark, u64)>, snapshots: &mut Vec<Vec<u8>>| {
        let bytes = std::fs::read(&mark_path).expect("mark");
        if snapshots.last() != Some(&bytes) {
            let m = read_mark(scratch, Some(&bytes))
                .expect("mark exists")
                .expect("mark valid");
            history.push((m, m.bookmark.sequence.0));
            snapshots.push(bytes);
        }
    };
    {
        let mut r = ReplicaWal::open(
            &db,
            ReplicaInit {
                page_size: PAGE_SIZE,
                bookmark: Bookmark::ZERO,
            },
        )
        .expect("create replica");
        record(&mut history, &mut snapshots);
        for s in steps {
            match *s {
                Step::Append(k) => {
                    let a = r.append(bm(k), &txns[k as usize - 1]).expect("append");
                    assert!(matches!(a, Appended::Applied { .. }));
                }
                Step::Chunk(k) => {
                    let ps = &txns[k as usize - 1];
                    let half = PageSet::new(
                        ps.page_size(),
                        ps.db_size_pages(),
                        ps.pages()[..ps.len().div_ceil(2)].to_vec(),
                    )
                    .expect("chunk");
                    r.append_chunk(bm(k), &half, false).expect("chunk");
                }
                Step::Confirm(k) => r.confirm(bm(k)).expect("confirm"),
                Step::Persist => r.persist().expect("persist"),
                Step::Checkpoint => {
                    r.checkpoint().expect("checkpoint");
                }
            }
            record(&mut history, &mut snapshots);
        }
    }
    let files = read_files(&db);
    let durable = read_mark(scratch, files[MARK].as_deref())
        .expect("mark")
        .expect("mark valid");
    assert_eq!(Some(&durable), history.last().map(|h| &h.0));
    let scan = scan_wal(files[WAL].as_deref().unwrap_or_default());
    if durable.frame > 0 {
        assert_eq!(scan.salt, Some(durable.salt), "{name}: generation");
        assert!(
            scan.frames[durable.frame as usize - 1].1 != 0,
            "{name}: commit"
        );
    }
    Scenario {
        name,
        role: Role::Replica {
            durable,
            history,
            snapshots,
        },
        files,
        scan,
        durable_state: durable.bookmark.sequence.0,
        durable_frame: durable.frame as usize,
        db_state,
    }
}

fn build() -> Base {
    const PREFIX: &str = "walrelay-fuzz-crash-";
    let parent = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    // Work directories of earlier processes of this target that are gone.
    for entry in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let pid = name.to_str().and_then(|n| n.strip_prefix(PREFIX));
        if pid.is_some_and(|p| !Path::new("/proc").join(p).exists()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    let root = parent.join(format!("{PREFIX}{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let (build, run, scratch) = (root.join("build"), root.join("run"), root.join("scratch"));
    for d in [&build, &run, &scratch] {
        std::fs::create_dir_all(d).expect("work dir");
    }
    // Initialises SQLite before seeding its PRNG.
    drop(Connection::open_in_memory().expect("sqlite"));
    seed_prng();
    let (txns, mut scenarios) = build_primaries(&build);
    use Step::*;
    let replicas: [(&'static str, Vec<Step>, u64); 4] = [
        // W@2, W@3 persisted; 4 confirmed only; 5 unconfirmed; half of 6.
        (
            "replica",
            vec![
                Append(1),
                Append(2),
                Confirm(2),
                Persist,
                Append(3),
                Confirm(3),
                Persist,
                Append(4),
                Confirm(4),
                Append(5),
                Chunk(6),
            ],
            0,
        ),
        // The database file holds 1..3 (checkpointed while 4 was
        // unconfirmed, so the WAL keeps its generation); W@4 persisted.
        (
            "replica-checkpointed",
            vec![
                Append(1),
                Append(2),
                Append(3),
                Confirm(3),
                Append(4),
                Checkpoint,
                Confirm(4),
                Persist,
                Append(5),
                Confirm(5),
                Append(6),
            ],
            3,
        ),
        // Checkpointed at 3, then appending 4 restarted the WAL (watermark
        // frame 0 in the new generation); W@4 in the new generation.
        (
            "replica-restarted",
            vec![
                Append(1),
                Append(2),
                Append(3),
                Confirm(3),
                Checkpoint,
                Append(4),
                Confirm(4),
                Persist,
                Append(5),
                Confirm(5),
                Append(6),
            ],
            3,
        ),
        // As above, but the durable watermark is the restart's (frame 0).
        (
            "replica-restart-frame0",
            vec![
                Append(1),
                Append(2),
                Append(3),
                Confirm(3),
                Checkpoint,
                Append(4),
                Confirm(4),
                Append(5),
            ],
            3,
        ),
    ];
    for (name, steps, db_state) in replicas {
        scenarios.push(build_replica(
            &build, &scratch, name, &txns, &steps, db_state,
        ));
    }
    let _ = std::fs::remove_dir_all(&build);
    for (i, sc) in scenarios.iter().enumerate() {
        trace(|| {
            format!(
                "scenario {i} {}: durable transaction {} (frame {}), database file at {}, \
                 {} bytes, WAL {} bytes with {} valid frames",
                sc.name,
                sc.durable_state,
                sc.durable_frame,
                sc.db_state,
                sc.files[DB].as_ref().map_or(0, Vec::len),
                sc.files[WAL].as_ref().map_or(0, Vec::len),
                sc.scan.frames.len()
            )
        });
    }
    Base {
        run,
        scratch,
        txns,
        scenarios,
    }
}

static BASE: OnceLock<Base> = OnceLock::new();

/// `WALRELAY_FUZZ_TRACE=1` prints the base states and, per execution, how
/// it was classified and what happened (to see which checks inputs reach).
fn trace(line: impl FnOnce() -> String) {
    static ON: OnceLock<bool> = OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("WALRELAY_FUZZ_TRACE").is_some()) {
        eprintln!("{}", line());
    }
}

// ------------------------------------------------------------ mutations

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte().unwrap_or(0), self.byte().unwrap_or(0)])
    }
    fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | (u32::from(self.u16()) << 16)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let n = n.min(self.0.len());
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        b.to_vec()
    }
}

/// Fills `len` bytes at `off` (growing the file if needed): zeros, ones,
/// one repeated byte, or bytes from the input.
fn fill(file: &mut Option<Vec<u8>>, off: usize, len: usize, pattern: u8, input: &mut Input) {
    let f = file.get_or_insert_with(Vec::new);
    let src = if pattern % 4 == 3 {
        input.bytes(len)
    } else {
        Vec::new()
    };
    let b = match pattern % 4 {
        0 => 0,
        1 => 0xff,
        _ => pattern,
    };
    if f.len() < off + len {
        f.resize(off + len, 0);
    }
    for (i, x) in f[off..off + len].iter_mut().enumerate() {
        *x = if pattern % 4 == 3 {
            src.get(i).copied().unwrap_or(0xa5)
        } else {
            b
        };
    }
}

fn truncate(file: &mut Option<Vec<u8>>, len: usize) {
    if let Some(f) = file {
        f.truncate(len);
    }
}

/// A well-formed watermark file whose newest slot says `m`, built through
/// the real writer.
fn forge(scratch: &Path, current: Option<&[u8]>, m: &Watermark) -> Vec<u8> {
    let p = scratch.join("forge");
    let _ = std::fs::remove_file(&p);
    if let Some(b) = current {
        std::fs::write(&p, b).expect("forge");
    }
    match WatermarkFile::open(&p, *m) {
        Ok((mut f, _)) => f.store(m).expect("store"),
        Err(_) => {
            std::fs::remove_file(&p).expect("rm forge");
            WatermarkFile::open(&p, *m).expect("fresh forge");
        }
    }
    std::fs::read(&p).expect("forged")
}

fn mutate(base: &Base, sc: &Scenario, input: &mut Input) -> Files {
    let mut files = sc.files.clone();
    let fb = frame_bytes(PAGE_SIZE) as usize;
    for _ in 0..MAX_OPS {
        let Some(op) = input.byte() else { break };
        let which = match usize::from(input.byte().unwrap_or(0) % 4) {
            // A primary has no watermark file: its WAL instead.
            MARK if matches!(sc.role, Role::Primary) => WAL,
            w => w,
        };
        let len_of = |files: &Files, i: usize| files[i].as_ref().map_or(0, Vec::len);
        match op % 12 {
            // Truncate a file at an arbitrary offset.
            0 => {
                let len = len_of(&files, which);
                truncate(&mut files[which], input.u32() as usize % (len + 1));
            }
            // Truncate the WAL at or inside a frame, or the database at a page.
            1 => {
                if which % 2 == 0 {
                    let n = usize::from(input.u16()) % (len_of(&files, DB) / PS + 2);
                    truncate(&mut files[DB], n * PS);
                } else {
                    let n = usize::from(input.byte().unwrap_or(0));
                    let inside = usize::from(input.u16()) % fb;
                    truncate(&mut files[WAL], WAL_HEADER_BYTES + n * fb + inside);
                }
            }
            // Overwrite a range (possibly past the end) with a pattern.
            2 | 3 => {
                let len = len_of(&files, which);
                let off = input.u32() as usize % (len + 64);
                let n = if op % 12 == 2 {
                    usize::from(input.u16()) % 2048 + 1
                } else {
                    usize::from(input.byte().unwrap_or(0)) % 64 + 1
                };
                let pattern = input.byte().unwrap_or(0);
                fill(&mut files[which], off, n, pattern, input);
            }
            // Tear a WAL frame: part of its header or page.
            4 => {
                let frame = usize::from(input.byte().unwrap_or(0)) % (sc.scan.frames.len() + 2);
                let inside = usize::from(input.u16()) % fb;
                let n = usize::from(input.u16()) % (fb - inside) + 1;
                let pattern = input.byte().unwrap_or(0);
                fill(
                    &mut files[WAL],
                    WAL_HEADER_BYTES + frame * fb + inside,
                    n,
                    pattern,
                    input,
                );
            }
            // Tear a database page.
            5 => {
                let page = usize::from(input.byte().unwrap_or(0)) % (len_of(&files, DB) / PS + 2);
                let inside = usize::from(input.u16()) % PS;
                let n = usize::from(input.u16()) % (PS - inside) + 1;
                let pattern = input.byte().unwrap_or(0);
                fill(&mut files[DB], page * PS + inside, n, pattern, input);
            }
            // Grow a file with a pattern.
            6 => {
                let len = len_of(&files, which);
                let n = usize::from(input.u16()) % 4096 + 1;
                let pattern = input.byte().unwrap_or(0);
                fill(&mut files[which], len, n, pattern, input);
            }
            // Delete a file.
            7 => files[which] = None,
            // Replace the wal-index with a pattern of some size.
            8 => {
                let n = usize::from(input.u16()) % (64 * 1024);
                let pattern = input.byte().unwrap_or(0);
                files[SHM] = Some(Vec::new());
                fill(&mut files[SHM], 0, n, pattern, input);
            }
            // Tear one watermark slot.
            9 => {
                let slot = usize::from(which % 2) * 64;
                let inside = usize::from(input.byte().unwrap_or(0)) % 64;
                let n = usize::from(input.byte().unwrap_or(0)) % (64 - inside) + 1;
                let pattern = input.byte().unwrap_or(0);
                fill(&mut files[MARK], slot + inside, n, pattern, input);
            }
            // A stale watermark file: an earlier persisted image.
            10 => {
                if let Role::Replica { snapshots, .. } = &sc.role {
                    let i = usize::from(input.byte().unwrap_or(0)) % snapshots.len();
                    files[MARK] = Some(snapshots[i].clone());
                }
            }
            // A forged, well-formed watermark: a persisted one with fields
            // changed, or pointing at a frame of the WAL.
            _ => {
                let Role::Replica { history, .. } = &sc.role else {
                    continue;
                };
                let mut m = history[usize::from(input.byte().unwrap_or(0)) % history.len()].0;
                let what = input.byte().unwrap_or(0);
                let delta = input.byte().unwrap_or(0) as i8 as i32;
                if what & 1 != 0 {
                    m.frame = m.frame.wrapping_add_signed(delta);
                }
                if what & 2 != 0 {
                    m.bookmark = Bookmark::new(
                        Epoch(m.bookmark.epoch.0.max(1)),
                        Sequence(m.bookmark.sequence.0.wrapping_add_signed(i64::from(delta))),
                    );
                }
                if what & 4 != 0 {
                    m.salt[usize::from(input.byte().unwrap_or(0)) % 8] ^= input.byte().unwrap_or(1);
                }
                if what & 8 != 0 {
                    // Point at a frame of the WAL, with its real checksum.
                    let n = usize::from(input.byte().unwrap_or(0)) % (sc.scan.frames.len() + 1);
                    if n > 0 {
                        let wal = sc.files[WAL].as_deref().unwrap_or_default();
                        let off = frame_offset(PAGE_SIZE, FrameNo::new(n as u32)) as usize;
                        let mut hb = [0u8; FRAME_HEADER_BYTES];
                        hb.copy_from_slice(&wal[off..off + FRAME_HEADER_BYTES]);
                        let fh = FrameHeader::decode(&hb);
                        m.frame = n as u32;
                        m.checksum = fh.checksum;
                        if let Some(s) = sc.scan.salt {
                            m.salt = s;
                        }
                    }
                }
                if what & 16 != 0 {
                    m.db_pages = m.db_pages.wrapping_add_signed(delta);
                }
                if what & 32 != 0 {
                    m.page_size = [0, 1, 3, 511, 1024, 4096, 65536, u32::MAX]
                        [usize::from(input.byte().unwrap_or(0)) % 8];
                }
                if what & 64 != 0 {
                    m.checksum.0 ^= u32::from(input.byte().unwrap_or(1));
                }
                files[MARK] = Some(forge(&base.scratch, files[MARK].as_deref(), &m));
            }
        }
    }
    files
}

// ------------------------------------------------------------ classification

/// Whether the database file differs from the base state only where a
/// crash during a checkpoint could have left it: torn or missing pages
/// that WAL frames in `cover` hold, or pages past both the base file and
/// the database's size `db_pages`. Base pages never go missing: a
/// checkpoint never shrinks the file below a state the WAL still names.
fn db_plausible(base: &[u8], new: Option<&[u8]>, cover: &BTreeSet<u32>, db_pages: u32) -> bool {
    let Some(new) = new else { return false };
    let base_pages = base.len() / PS;
    let new_pages = new.len().div_ceil(PS);
    (1..=base_pages.max(new_pages)).all(|p| {
        let range = (p - 1) * PS..p * PS;
        if p <= base_pages {
            match new.get(range.clone()) {
                None => false,
                Some(n) => n == &base[range] || cover.contains(&(p as u32)),
            }
        } else {
            cover.contains(&(p as u32)) || p as u32 > db_pages
        }
    })
}

fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Complete WAL frames of the base state that survived unchanged.
fn intact_frames(sc: &Scenario, files: &Files) -> usize {
    let (Some(base), Some(new)) = (sc.files[WAL].as_deref(), files[WAL].as_deref()) else {
        return 0;
    };
    let intact = common_prefix(base, new);
    if intact < WAL_HEADER_BYTES {
        return 0;
    }
    ((intact - WAL_HEADER_BYTES) / frame_bytes(PAGE_SIZE) as usize).min(sc.scan.frames.len())
}

/// Which files an input changed, for the trace.
fn changes(sc: &Scenario, files: &Files) -> String {
    let names = ["db", "wal", "shm", "mark"];
    let mut out = Vec::new();
    for (i, name) in names.iter().enumerate() {
        match (&sc.files[i], &files[i]) {
            (a, b) if a == b => {}
            (_, None) => out.push(format!("{name} deleted")),
            (None, Some(b)) => out.push(format!("{name} created ({} bytes)", b.len())),
            (Some(a), Some(b)) => {
                let at = common_prefix(a, b);
                out.push(format!("{name} {}->{} bytes from {at}", a.len(), b.len()));
            }
        }
    }
    if out.is_empty() {
        "unchanged".into()
    } else {
        out.join(", ")
    }
}

// ------------------------------------------------------------ replica

fn check_replica(base: &Base, sc: &Scenario, files: &Files) {
    let Role::Replica {
        durable, history, ..
    } = &sc.role
    else {
        unreachable!()
    };
    let db = base.run.join("replica.db");
    let intact = intact_frames(sc, files);
    // The watermark the open will find.
    let mark = read_mark(&base.scratch, files[MARK].as_deref());
    let (m, k) = match &mark {
        Some(Err(_)) => (None, None),
        None => (
            Some(Watermark {
                bookmark: Bookmark::ZERO,
                salt: [0; 8],
                frame: 0,
                checksum: Default::default(),
                db_pages: 0,
                page_size: PAGE_SIZE,
            }),
            Some(0),
        ),
        Some(Ok(m)) => (Some(*m), history.iter().find(|h| h.0 == *m).map(|h| h.1)),
    };
    let crash_state = m == Some(*durable);
    let base_db = sc.files[DB].as_deref().unwrap_or_default();
    let base_pages = (base_db.len() / PS) as u32;
    let (cover, db_ok, prefix_ok) = match m {
        Some(m) if m.frame > 0 && sc.scan.salt == Some(m.salt) => {
            let (cover, _) = sc.scan.cover(intact.min(m.frame as usize));
            let ok = db_plausible(base_db, files[DB].as_deref(), &cover, m.db_pages);
            (cover, ok, intact >= m.frame as usize)
        }
        // No WAL frame survives the open: the database file alone, whose
        // size is its length in the base state.
        Some(m) => {
            let cover = BTreeSet::new();
            let ok = db_plausible(base_db, files[DB].as_deref(), &cover, base_pages);
            (cover, ok, m.frame == 0)
        }
        None => (BTreeSet::new(), false, false),
    };
    let must_open = crash_state && db_ok && prefix_ok;
    let ctx = || {
        format!(
            "{}: watermark {m:?} (history {k:?}, durable {durable:?}), intact frames {intact}, \
             cover {cover:?}, db plausible {db_ok}, prefix intact {prefix_ok}; {}",
            sc.name,
            changes(sc, files)
        )
    };

    let opened = ReplicaWal::open(
        &db,
        ReplicaInit {
            page_size: PAGE_SIZE,
            bookmark: Bookmark::ZERO,
        },
    );
    let mut r = match opened {
        Err(e) => {
            assert!(
                !must_open,
                "a crash state of the replica did not open: {e}\n{}",
                ctx()
            );
            trace(|| format!("refused: {e} | {}", ctx()));
            return;
        }
        Ok(r) => r,
    };
    assert!(
        !matches!(mark, Some(Err(_))),
        "opened although the watermark file cannot be read\n{}",
        ctx()
    );
    // Forged watermarks say what they say: only the absence of panics.
    let Some(k) = k else {
        trace(|| format!("opened on a forged watermark | {}", ctx()));
        return;
    };
    assert_eq!(r.confirmed(), bm(k), "confirmed position\n{}", ctx());
    if !db_ok {
        trace(|| format!("opened on media damage | {}", ctx()));
        return; // media damage the WAL does not cover
    }
    let reader = open_vfs(&db, OpenFlags::SQLITE_OPEN_READ_ONLY);
    let reader = match reader {
        Ok(c) => c,
        Err(e) => {
            assert!(!must_open, "no reader on a crash state: {e}\n{}", ctx());
            return;
        }
    };
    let state = seen(&reader);
    match &state {
        Ok(Seen::Whole(j)) => assert!(
            *j <= sc.durable_state,
            "revealed transaction {j} past the durable watermark\n{}",
            ctx()
        ),
        Ok(Seen::Mixed { max_marker, why }) => assert!(
            *max_marker <= sc.durable_state,
            "revealed marker {max_marker} past the durable watermark ({why})\n{}",
            ctx()
        ),
        Err(e) => assert!(!must_open, "read failed on a crash state: {e}\n{}", ctx()),
    }
    // The database file does not run ahead of the watermark found: exactly
    // its transaction, intact.
    if k >= sc.db_state && prefix_ok {
        assert_eq!(
            state.as_ref().ok(),
            Some(&Seen::Whole(k)),
            "state after recovery\n{}",
            ctx()
        );
        let check = integrity(&reader);
        assert!(
            check.as_ref().is_ok_and(|v| v == &["ok"]),
            "integrity_check after recovery: {check:?}\n{}",
            ctx()
        );
    }
    if !must_open {
        trace(|| format!("opened, saw {state:?} | {}", ctx()));
        return;
    }
    // And it goes on: the next transaction appends, reveals and
    // checkpoints.
    let next = k + 1;
    let a = r
        .append(bm(next), &base.txns[next as usize - 1])
        .unwrap_or_else(|e| panic!("append {next} after recovery: {e}\n{}", ctx()));
    assert!(matches!(a, Appended::Applied { .. }), "{}", ctx());
    r.confirm(bm(next))
        .unwrap_or_else(|e| panic!("confirm {next} after recovery: {e}\n{}", ctx()));
    assert_eq!(seen(&reader).ok(), Some(Seen::Whole(next)), "{}", ctx());
    r.checkpoint()
        .unwrap_or_else(|e| panic!("checkpoint after recovery: {e}\n{}", ctx()));
    assert_eq!(seen(&reader).ok(), Some(Seen::Whole(next)), "{}", ctx());
    assert!(integrity_ok(&reader), "integrity after going on\n{}", ctx());
    // Readers and checkpoints trust the applier's wal-index; only a
    // recovery checks that the frames written after the crash continue the
    // checksum chain: persist, close, reopen.
    r.persist()
        .unwrap_or_else(|e| panic!("persist after recovery: {e}\n{}", ctx()));
    drop(reader);
    drop(r);
    let r = ReplicaWal::open(
        &db,
        ReplicaInit {
            page_size: PAGE_SIZE,
            bookmark: Bookmark::ZERO,
        },
    )
    .unwrap_or_else(|e| panic!("reopen after going on: {e}\n{}", ctx()));
    assert_eq!(r.confirmed(), bm(next), "{}", ctx());
    let reader = open_vfs(&db, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap_or_else(|e| panic!("reader after reopen: {e}\n{}", ctx()));
    assert_eq!(seen(&reader).ok(), Some(Seen::Whole(next)), "{}", ctx());
    drop(reader);
    trace(|| format!("crash state: opened at {k}, went on to {next} | {}", ctx()));
}

// ------------------------------------------------------------ primary

fn pages(c: &Connection) -> rusqlite::Result<Vec<Vec<u8>>> {
    let mut s = c.prepare("SELECT data FROM sqlite_dbpage ORDER BY pgno")?;
    s.query_map([], |r| r.get(0))?.collect()
}

fn check_primary(base: &Base, sc: &Scenario, files: &Files) {
    let db = base.run.join("primary.db");
    let intact = intact_frames(sc, files);
    let (cover, c) = sc.scan.cover(intact.min(sc.durable_frame));
    let base_db = sc.files[DB].as_deref().unwrap_or_default();
    // The database's size in pages at that commit (or the file's own).
    let db_pages = if c > 0 {
        sc.scan.frames[c - 1].1
    } else {
        (base_db.len() / PS) as u32
    };
    let db_ok = db_plausible(base_db, files[DB].as_deref(), &cover, db_pages);
    // SQLite's recovery keeps the WAL's valid prefix, up to its last commit.
    let expect = sc.db_state + sc.scan.commits_through(c);
    let ctx = || {
        format!(
            "{}: intact frames {intact}, last intact commit frame {c}, cover {cover:?}, \
             db plausible {db_ok}, expected transaction {expect}; {}",
            sc.name,
            changes(sc, files)
        )
    };
    let rec = Arc::new(Recorder::default());
    let att = attach(&db, rec.clone()).expect("attach");
    let conn = open_vfs(&db, OpenFlags::SQLITE_OPEN_READ_WRITE).and_then(|c| {
        c.execute_batch("PRAGMA wal_autocheckpoint=0; PRAGMA synchronous=FULL;")?;
        Ok(c)
    });
    let conn = match conn {
        Ok(c) => c,
        Err(e) => {
            assert!(!db_ok, "the primary did not open: {e}\n{}", ctx());
            trace(|| format!("refused: {e} | {}", ctx()));
            return;
        }
    };
    if !db_ok {
        // Media damage: anything but a panic goes; still try a write.
        let saw = seen(&conn);
        let wrote = conn.execute_batch(&txn_sql(TXNS + 1));
        trace(|| {
            format!(
                "opened on media damage, saw {saw:?}, wrote {wrote:?} | {}",
                ctx()
            )
        });
        return;
    }
    let state = seen(&conn);
    assert_eq!(
        state.as_ref().ok(),
        Some(&Seen::Whole(expect)),
        "state after recovery: {state:?}\n{}",
        ctx()
    );
    let check = integrity(&conn);
    assert!(
        check.as_ref().is_ok_and(|v| v == &["ok"]),
        "integrity_check after recovery: {check:?}\n{}",
        ctx()
    );
    // The next transaction commits and is captured as a page set that
    // turns the database before it into the database after it.
    // `sqlite_dbpage` lists the b-tree's pages; the pager's size (the page
    // set's) can be larger when the file holds pages past the b-tree's end
    // (a file grown by a torn write), so those count as zero pages here and
    // only the b-tree's pages are compared.
    let before = pages(&conn).unwrap_or_else(|e| panic!("pages: {e}\n{}", ctx()));
    conn.execute_batch(&txn_sql(expect + 1))
        .unwrap_or_else(|e| panic!("next commit after recovery: {e}\n{}", ctx()));
    let after = pages(&conn).unwrap_or_else(|e| panic!("pages: {e}\n{}", ctx()));
    assert!(att.poisoned().is_none(), "{:?}\n{}", att.poisoned(), ctx());
    let captured = std::mem::take(&mut *rec.0.lock().expect("recorder"));
    assert_eq!(captured.len(), 1, "one captured transaction\n{}", ctx());
    let ps = &captured[0].pages;
    let before_len = before.len();
    let mut image = before;
    image.resize((ps.db_size_pages() as usize).max(image.len()), vec![0; PS]);
    for (no, data) in ps.pages() {
        image[no.get() as usize - 1] = data.to_vec();
    }
    assert!(
        ps.db_size_pages() as usize >= after.len(),
        "the page set's database size {} is short of the {} pages SQLite has\n{}",
        ps.db_size_pages(),
        after.len(),
        ctx()
    );
    image.truncate(after.len());
    if image != after {
        let differ: Vec<usize> = (0..image.len().max(after.len()))
            .filter(|&i| image.get(i) != after.get(i))
            .map(|i| i + 1)
            .collect();
        let captured: Vec<u32> = ps.pages().iter().map(|(no, _)| no.get()).collect();
        panic!(
            "the captured page set does not reproduce the database: pages {differ:?} differ; \
             {} pages before, {} after, page set of {} pages holds {captured:?}\n{}",
            before_len,
            after.len(),
            ps.db_size_pages(),
            ctx()
        );
    }
    assert_eq!(seen(&conn).ok(), Some(Seen::Whole(expect + 1)), "{}", ctx());
    trace(|| format!("recovered {expect}, captured {} | {}", expect + 1, ctx()));
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
    let base = BASE.get_or_init(build);
    let fds = open_fds();
    seed_prng();
    let mut input = Input(data);
    let pick = usize::from(input.byte().unwrap_or(0)) % base.scenarios.len();
    let sc = &base.scenarios[pick];
    let files = mutate(base, sc, &mut input);
    match sc.role {
        Role::Replica { .. } => {
            write_files(&base.run.join("replica.db"), &files);
            check_replica(base, sc, &files);
        }
        Role::Primary => {
            write_files(&base.run.join("primary.db"), &files);
            check_primary(base, sc, &files);
        }
    }
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
