//! Overhead of the capturing `walrelay` VFS against SQLite's `unix-excl`
//! VFS, the one it wraps, and against the default `unix` VFS, measured side
//! by side in one run.
//!
//! `walrelay` forwards every file operation to `unix-excl` (a process keeps
//! its locks and the wal-index in memory: no `fcntl` per lock), so the
//! ratio walrelay / unix-excl is what capture itself costs, and walrelay /
//! unix is what a user moving from the default VFS sees.
//!
//! For each `PRAGMA synchronous` level (OFF, NORMAL, FULL) and each VFS:
//!
//! - `insert_commit/sync=<LEVEL>`: latency of one autocommit
//!   `INSERT INTO t(v) VALUES (?1)` with a 100-byte blob (cached statement),
//!   i.e. one write transaction from BEGIN to durable (per `synchronous`)
//!   commit, including, for walrelay, capture and hand-off to the sink.
//! - `insert_commit_interleaved/sync=<LEVEL>`: the same insert on
//!   `unix-excl` and `walrelay`, but each measured insert on one VFS follows
//!   an untimed insert on the other, so both are measured under the same
//!   conditions at the same moments (the plain group runs each VFS for its
//!   whole measurement time in turn, and machine drift between them lands
//!   on the ratio).
//! - `point_read/sync=<LEVEL>`: latency of `SELECT v FROM t WHERE id = ?1`
//!   (cached statement, one read transaction) with ids drawn uniformly from
//!   the 10,000 pre-populated rows by a fixed-seed LCG.
//! - `paired ratios` (printed, not a criterion group): for OFF and NORMAL,
//!   rounds of a block of inserts on each VFS back to back (the order
//!   alternating by round); each round gives the ratio of the two blocks'
//!   mean latencies, and the median and quartiles over the rounds are
//!   printed. A slow moment of the machine lands on both blocks of its
//!   round, so the median ratio holds still where the criterion means of
//!   whole phases move by more than the 5% the target is about; the
//!   target is judged on these (papers/performance.md, VFS overhead).
//!
//! Each (VFS, synchronous) pair has its own database file in a temporary
//! directory, in WAL mode with `wal_autocheckpoint=0` on both VFSes. The WAL
//! is kept bounded identically for both: a PASSIVE checkpoint through
//! `sqlite3_wal_checkpoint_v2` after every 1,000 inserts, timed *out* of the
//! measurement (`iter_custom`), and one before the read benchmark starts.
//! The walrelay sink only counts transactions; after each pair the bench
//! checks that every insert reached it and that capture never poisoned.
//!
//! Run: `cargo bench -p walrelay-benches --bench vfs_overhead`
//! (`-- --test` for a one-iteration smoke run).

use criterion::{
    BenchmarkGroup, Criterion, criterion_group, criterion_main, measurement::WallTime,
};
use rusqlite::{Connection, OpenFlags, ffi, params};
use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use walrelay_vfs::{Attachment, CaptureSink, CapturedTransaction, SinkError, VFS_NAME, attach};

/// Rows in `t` before any benchmark runs; point reads pick ids in `1..=ROWS`.
const ROWS: u64 = 10_000;
/// A PASSIVE checkpoint after this many benchmark inserts keeps the WAL bounded.
const CHECKPOINT_EVERY: u64 = 1_000;
/// Size of the blob each row carries.
const VALUE_LEN: usize = 100;

/// A sink that counts transactions and drops them.
#[derive(Debug, Default)]
struct CountingSink(AtomicU64);

impl CaptureSink for CountingSink {
    fn committed(&self, txn: CapturedTransaction) -> Result<(), SinkError> {
        drop(txn);
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Vfs {
    Unix,
    /// What `walrelay` wraps: the baseline for capture's own cost.
    UnixExcl,
    Walrelay,
}

impl Vfs {
    const ALL: [Vfs; 3] = [Vfs::Unix, Vfs::UnixExcl, Vfs::Walrelay];

    fn name(self) -> &'static str {
        match self {
            Vfs::Unix => "unix",
            Vfs::UnixExcl => "unix-excl",
            Vfs::Walrelay => VFS_NAME,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum SyncLevel {
    Off,
    Normal,
    Full,
}

impl SyncLevel {
    const ALL: [SyncLevel; 3] = [SyncLevel::Off, SyncLevel::Normal, SyncLevel::Full];

    fn name(self) -> &'static str {
        match self {
            SyncLevel::Off => "OFF",
            SyncLevel::Normal => "NORMAL",
            SyncLevel::Full => "FULL",
        }
    }
}

/// 64-bit LCG (Knuth's MMIX constants); the high bits are used.
#[derive(Debug)]
struct Lcg(u64);

impl Lcg {
    fn next_id(&mut self) -> i64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        // ROWS is far below 2^32, so the modulo bias is negligible.
        ((self.0 >> 32) % ROWS + 1) as i64
    }
}

/// One database opened through one VFS at one synchronous level.
///
/// Field order matters: the connection drops before the attachment.
#[derive(Debug)]
struct Fixture {
    conn: Connection,
    sink: Option<Arc<CountingSink>>,
    attachment: Option<Attachment>,
    vfs: Vfs,
    /// Inserts run by the benchmark so far (drives the checkpoint cadence).
    inserts: u64,
    /// Benchmark inserts since the last periodic checkpoint.
    since_checkpoint: u64,
    value: Vec<u8>,
    rng: Lcg,
}

impl Fixture {
    fn open(dir: &Path, vfs: Vfs, sync: SyncLevel) -> Fixture {
        let path = dir.join(format!("{}-{}.db", vfs.name(), sync.name()));
        {
            // The database must be in WAL mode before walrelay opens it; do the
            // same for unix so both start from the same file.
            let c = Connection::open(&path).expect("create database");
            let mode: String = c
                .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
                .expect("journal_mode=WAL");
            assert_eq!(mode, "wal");
        }
        let (sink, attachment) = match vfs {
            Vfs::Unix | Vfs::UnixExcl => (None, None),
            Vfs::Walrelay => {
                let sink = Arc::new(CountingSink::default());
                let att = attach(&path, Arc::clone(&sink) as Arc<dyn CaptureSink>)
                    .expect("attach to walrelay");
                (Some(sink), Some(att))
            }
        };
        let conn = Connection::open_with_flags_and_vfs(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
            vfs.name(),
        )
        .expect("open through the VFS under test");
        conn.execute_batch(&format!(
            "PRAGMA wal_autocheckpoint=0;
             PRAGMA synchronous={};
             CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB NOT NULL);",
            sync.name()
        ))
        .expect("configure");
        let mut fx = Fixture {
            conn,
            sink,
            attachment,
            vfs,
            inserts: 0,
            since_checkpoint: 0,
            value: (0..VALUE_LEN).map(|i| i as u8).collect(),
            rng: Lcg(0x5EED_BA5E),
        };
        {
            let tx = fx.conn.transaction().expect("begin");
            {
                let mut ins = tx
                    .prepare_cached("INSERT INTO t(v) VALUES (?1)")
                    .expect("prepare insert");
                for _ in 0..ROWS {
                    ins.execute(params![fx.value]).expect("populate");
                }
            }
            tx.commit().expect("commit populate");
        }
        fx.checkpoint();
        fx
    }

    /// PASSIVE checkpoint of `main`, the same call for both VFSes (walrelay
    /// refuses `PRAGMA wal_checkpoint`).
    fn checkpoint(&self) {
        let (mut log, mut ckpt) = (0, 0);
        // SAFETY: `self.conn` is a live connection owned by this fixture and
        // not used concurrently; the schema name is a NUL-terminated C string
        // and both out-pointers point to live locals.
        let rc = unsafe {
            ffi::sqlite3_wal_checkpoint_v2(
                self.conn.handle(),
                c"main".as_ptr(),
                ffi::SQLITE_CHECKPOINT_PASSIVE,
                &mut log,
                &mut ckpt,
            )
        };
        assert_eq!(rc, ffi::SQLITE_OK, "checkpoint on {}", self.vfs.name());
        assert_eq!(
            log, ckpt,
            "a lone connection's PASSIVE checkpoint backfills everything"
        );
    }

    /// One one-row autocommit insert; returns its latency. The periodic
    /// checkpoint that keeps the WAL bounded runs after it, untimed.
    fn insert_one(&mut self) -> Duration {
        let mut stmt = self
            .conn
            .prepare_cached("INSERT INTO t(v) VALUES (?1)")
            .expect("prepare insert");
        let start = Instant::now();
        black_box(stmt.execute(params![self.value]).expect("insert"));
        let took = start.elapsed();
        drop(stmt);
        self.inserts += 1;
        self.since_checkpoint += 1;
        if self.since_checkpoint == CHECKPOINT_EVERY {
            self.since_checkpoint = 0;
            self.checkpoint();
        }
        took
    }

    /// Runs `iters` inserts and returns the time spent in them.
    fn timed_inserts(&mut self, iters: u64) -> Duration {
        (0..iters).map(|_| self.insert_one()).sum()
    }

    /// Runs `iters` inserts, each right after an (untimed) insert on
    /// `other`, so that both VFSes are measured under the same conditions
    /// at the same moments: drift and cache effects hit both alike.
    fn timed_inserts_interleaved(&mut self, other: &mut Fixture, iters: u64) -> Duration {
        (0..iters)
            .map(|_| {
                other.insert_one();
                self.insert_one()
            })
            .sum()
    }

    fn point_read(&mut self) -> usize {
        let id = self.rng.next_id();
        let mut stmt = self
            .conn
            .prepare_cached("SELECT v FROM t WHERE id = ?1")
            .expect("prepare select");
        stmt.query_row([id], |r| Ok(r.get_ref(0)?.as_blob()?.len()))
            .expect("point read")
    }

    /// Every benchmark insert (plus the populate transaction) reached the
    /// sink, and capture never failed.
    fn check_captured(&self) {
        if let (Some(sink), Some(att)) = (&self.sink, &self.attachment) {
            assert!(
                att.poisoned().is_none(),
                "capture poisoned: {:?}",
                att.poisoned()
            );
            let got = sink.0.load(Ordering::Relaxed);
            // CREATE TABLE + populate + one per benchmark insert.
            assert_eq!(got, 2 + self.inserts, "transactions captured");
        }
    }
}

fn configure(group: &mut BenchmarkGroup<'_, WallTime>) {
    group
        .sample_size(60)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
}

/// Rounds and inserts per block for the paired ratios (`--test`: a smoke run).
fn paired_shape() -> (usize, u64) {
    if std::env::args().any(|a| a == "--test") {
        (3, 20)
    } else {
        (61, 400)
    }
}

/// The median and quartiles of `walrelay / other` over paired rounds.
fn paired_ratios(walrelay: &mut Fixture, other: &mut Fixture) -> [f64; 3] {
    let (rounds, block) = paired_shape();
    let mut ratios: Vec<f64> = (0..rounds)
        .map(|r| {
            let (w, o) = if r % 2 == 0 {
                let w = walrelay.timed_inserts(block);
                (w, other.timed_inserts(block))
            } else {
                let o = other.timed_inserts(block);
                (walrelay.timed_inserts(block), o)
            };
            w.as_secs_f64() / o.as_secs_f64()
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    let at = |q: usize| ratios[(ratios.len() - 1) * q / 4];
    [at(1), at(2), at(3)]
}

fn print_paired(sync: SyncLevel, fixtures: &mut [Fixture]) {
    let [unix, excl, walrelay] = fixtures else {
        unreachable!("one fixture per VFS in Vfs::ALL");
    };
    let (rounds, block) = paired_shape();
    for (other, name) in [(excl, "unix-excl"), (unix, "unix")] {
        let [q1, median, q3] = paired_ratios(walrelay, other);
        println!(
            "paired ratio sync={} walrelay / {name:<9}: median {median:.3}x (quartiles {q1:.3}-{q3:.3}, {rounds} rounds of {block} inserts each)",
            sync.name()
        );
    }
}

fn vfs_overhead(c: &mut Criterion) {
    for sync in SyncLevel::ALL {
        let dir = tempfile::Builder::new()
            .prefix("walrelay-vfs-overhead-")
            .tempdir()
            .expect("tempdir");
        let mut fixtures: Vec<Fixture> = Vfs::ALL
            .iter()
            .map(|&vfs| Fixture::open(dir.path(), vfs, sync))
            .collect();

        {
            let mut group = c.benchmark_group(format!("insert_commit/sync={}", sync.name()));
            configure(&mut group);
            for fx in &mut fixtures {
                group.bench_function(fx.vfs.name(), |b| {
                    b.iter_custom(|iters| fx.timed_inserts(iters))
                });
            }
            group.finish();
        }

        {
            let mut group =
                c.benchmark_group(format!("insert_commit_interleaved/sync={}", sync.name()));
            configure(&mut group);
            let [_, base, walrelay] = fixtures.as_mut_slice() else {
                unreachable!("one fixture per VFS in Vfs::ALL");
            };
            group.bench_function(base.vfs.name(), |bench| {
                bench.iter_custom(|iters| base.timed_inserts_interleaved(walrelay, iters))
            });
            group.bench_function(walrelay.vfs.name(), |bench| {
                bench.iter_custom(|iters| walrelay.timed_inserts_interleaved(base, iters))
            });
            group.finish();
        }

        if !matches!(sync, SyncLevel::Full) {
            print_paired(sync, &mut fixtures);
        }

        for fx in &fixtures {
            fx.checkpoint();
        }

        {
            let mut group = c.benchmark_group(format!("point_read/sync={}", sync.name()));
            configure(&mut group);
            for fx in &mut fixtures {
                group.bench_function(fx.vfs.name(), |b| b.iter(|| black_box(fx.point_read())));
            }
            group.finish();
        }

        for fx in &fixtures {
            fx.check_captured();
        }
        // Connections close before their attachments (field order), and all
        // of them before the temporary directory goes.
        drop(fixtures);
        drop(dir);
    }
}

criterion_group!(benches, vfs_overhead);
criterion_main!(benches);
