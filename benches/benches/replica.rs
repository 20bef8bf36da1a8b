//! Replica apply benchmarks.
//!
//! - `confirm_flip/confirm_to_visible`: time from `ReplicaWal::confirm` to
//!   the confirmed row being visible in a new read transaction on a SQLite
//!   reader connection (confirm + one point query), one one-frame
//!   transaction per iteration; appending it (and the primary commit that
//!   produced it) is untimed. Per-iteration p50/p99 are printed at the end,
//!   beside criterion's estimate. Target: p50 <= 20 us.
//! - `apply_rate/{replica_apply, sqlite_writer}`: pages per second. The
//!   replica appends and confirms 100 ten-page transactions per iteration
//!   (recorded beforehand from a primary); the baseline is a plain SQLite
//!   writer (unix VFS, synchronous=OFF) committing the same 100 transactions
//!   (the replica without fsync too, `set_sync(false)`: like for like)
//!   from SQL. Both keep their WAL bounded the same way (checkpoint and
//!   restart near 1,000 frames). Target: replica >= 1.0x the writer.
//!
//! Run: `cargo bench -p walrelay-benches --bench replica`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rusqlite::{Connection, OpenFlags, ffi};
use std::hint::black_box;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use walrelay_replicator::{Bookmark, Epoch, Sequence};
use walrelay_vfs::{
    Attachment, CaptureSink, CapturedTransaction, PageSet, ReplicaInit, ReplicaWal, SinkError,
    VFS_NAME, attach,
};

const ROWS_PER_TXN: usize = 10;
const ROW_BYTES: usize = 3_000;
const TXNS_PER_ITER: usize = 100;
const WAL_LIMIT: u32 = 1_000;

#[derive(Default)]
struct Recorder(Mutex<Vec<PageSet>>);

impl CaptureSink for Recorder {
    fn committed(&self, txn: CapturedTransaction) -> Result<(), SinkError> {
        self.0
            .lock()
            .map_err(|_| SinkError("poisoned".into()))?
            .push(txn.pages);
        Ok(())
    }
}

fn create_wal_db(path: &Path) {
    let c = Connection::open(path).expect("create");
    c.execute_batch("PRAGMA journal_mode=WAL;").expect("wal");
}

fn checkpoint(c: &Connection) {
    // SAFETY: `c` is a live connection used only on this thread; the
    // schema name is NUL-terminated and the out-pointers may be null.
    let rc = unsafe {
        ffi::sqlite3_wal_checkpoint_v2(
            c.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_CHECKPOINT_PASSIVE,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    assert!(
        rc == ffi::SQLITE_OK || rc == ffi::SQLITE_BUSY,
        "checkpoint: {rc}"
    );
}

/// A primary captured through walrelay, whose page sets feed a replica.
/// Field order: connections drop before the attachment.
struct Primary {
    conn: Connection,
    rec: Arc<Recorder>,
    _att: Attachment,
    commits: u64,
}

impl Primary {
    fn open(dir: &Path) -> Primary {
        let path = dir.join("primary.db");
        create_wal_db(&path);
        let rec = Arc::new(Recorder::default());
        let att = attach(&path, rec.clone()).expect("attach");
        let conn =
            Connection::open_with_flags_and_vfs(&path, OpenFlags::SQLITE_OPEN_READ_WRITE, VFS_NAME)
                .expect("open primary");
        conn.execute_batch("PRAGMA synchronous=OFF; PRAGMA wal_autocheckpoint=0;")
            .expect("pragma");
        Primary {
            conn,
            rec,
            _att: att,
            commits: 0,
        }
    }

    fn exec(&mut self, sql: &str) {
        self.conn.execute_batch(sql).expect("primary exec");
        self.commits += 1;
        if self.commits.is_multiple_of(500) {
            checkpoint(&self.conn);
        }
    }

    fn take(&self) -> Vec<PageSet> {
        std::mem::take(&mut *self.rec.0.lock().expect("lock"))
    }
}

struct Replica {
    wal: ReplicaWal,
    reader: Connection,
    seq: u64,
}

impl Replica {
    fn open(path: &Path) -> Replica {
        let mut wal = ReplicaWal::open(
            path,
            ReplicaInit {
                page_size: 4096,
                bookmark: Bookmark::ZERO,
            },
        )
        .expect("open replica");
        wal.set_wal_limit(WAL_LIMIT);
        // Compared with a SQLite writer at synchronous=OFF: no fsync either.
        wal.set_sync(false).expect("sync off");
        let reader =
            Connection::open_with_flags_and_vfs(path, OpenFlags::SQLITE_OPEN_READ_ONLY, VFS_NAME)
                .expect("reader");
        Replica {
            wal,
            reader,
            seq: 0,
        }
    }

    fn next(&mut self) -> Bookmark {
        self.seq += 1;
        Bookmark::new(Epoch(1), Sequence(self.seq))
    }

    fn apply(&mut self, ps: &PageSet) {
        let b = self.next();
        self.wal.append(b, ps).expect("append");
        self.wal.confirm(b).expect("confirm");
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn confirm_flip(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut primary = Primary::open(dir.path());
    primary.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v INTEGER)");
    let mut replica = Replica::open(&dir.path().join("replica.db"));
    for ps in primary.take() {
        replica.apply(&ps);
    }
    let mut samples: Vec<Duration> = Vec::new();
    let mut next_id = 0i64;
    let mut group = c.benchmark_group("confirm_flip");
    group
        .sample_size(50)
        .measurement_time(Duration::from_secs(5));
    group.bench_function("confirm_to_visible", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                next_id += 1;
                primary.exec(&format!("INSERT INTO t VALUES ({next_id}, {next_id})"));
                let bookmark = replica.next();
                for ps in primary.take() {
                    replica.wal.append(bookmark, &ps).expect("append");
                }
                let mut q = replica
                    .reader
                    .prepare_cached("SELECT max(id) FROM t")
                    .expect("prepare");
                let start = Instant::now();
                replica.wal.confirm(bookmark).expect("confirm");
                let seen: i64 = q.query_row([], |r| r.get(0)).expect("read");
                let took = start.elapsed();
                assert_eq!(seen, next_id, "the confirmed row is visible");
                total += took;
                samples.push(took);
            }
            total
        })
    });
    group.finish();
    samples.sort();
    if samples.is_empty() {
        return; // filtered out
    }
    eprintln!(
        "confirm_flip per-iteration: n={} p50={:?} p99={:?} max={:?}",
        samples.len(),
        percentile(&samples, 0.50),
        percentile(&samples, 0.99),
        samples[samples.len() - 1]
    );
}

fn txn_sql(i: usize) -> String {
    let mut sql = String::from("BEGIN;");
    for r in 0..ROWS_PER_TXN {
        sql.push_str(&format!(
            "INSERT INTO t(v) VALUES (zeroblob({}));",
            ROW_BYTES + (i + r) % 7
        ));
    }
    sql.push_str("COMMIT;");
    sql
}

fn apply_rate(c: &mut Criterion) {
    // Record the workload once: 20 batches of 100 ten-row transactions.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut primary = Primary::open(dir.path());
    primary.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)");
    let schema = primary.take();
    let batches: Vec<Vec<PageSet>> = (0..20)
        .map(|b| {
            (0..TXNS_PER_ITER).for_each(|i| primary.exec(&txn_sql(b * TXNS_PER_ITER + i)));
            primary.take()
        })
        .collect();
    let pages: usize = batches[0].iter().map(PageSet::len).sum();
    let mut group = c.benchmark_group("apply_rate");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(6));
    group.throughput(Throughput::Elements(pages as u64));

    let mut round = 0;
    group.bench_function("replica_apply", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut done = 0;
            while done < iters {
                // A fresh replica per pass over the recorded batches.
                round += 1;
                let path = dir.path().join(format!("replica-{round}.db"));
                let mut replica = Replica::open(&path);
                for ps in &schema {
                    replica.apply(ps);
                }
                for batch in batches
                    .iter()
                    .take((iters - done).min(batches.len() as u64) as usize)
                {
                    let start = Instant::now();
                    for ps in batch {
                        replica.apply(black_box(ps));
                    }
                    total += start.elapsed();
                    done += 1;
                }
            }
            total
        })
    });

    group.bench_function("sqlite_writer", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut done = 0;
            while done < iters {
                round += 1;
                let path = dir.path().join(format!("writer-{round}.db"));
                create_wal_db(&path);
                let conn = Connection::open(&path).expect("writer");
                conn.execute_batch(
                    "PRAGMA synchronous=OFF; PRAGMA wal_autocheckpoint=0; \
                     CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB);",
                )
                .expect("setup");
                let mut frames = 0usize;
                for b in 0..(iters - done).min(batches.len() as u64) as usize {
                    let sql: Vec<String> = (0..TXNS_PER_ITER)
                        .map(|i| txn_sql(b * TXNS_PER_ITER + i))
                        .collect();
                    let start = Instant::now();
                    for s in &sql {
                        conn.execute_batch(s).expect("commit");
                    }
                    total += start.elapsed();
                    // Same WAL bound as the replica: checkpoint near the limit
                    // (the next commit restarts the WAL), inside the timing
                    // as the replica's is.
                    frames += pages;
                    if frames >= WAL_LIMIT as usize {
                        let start = Instant::now();
                        checkpoint(&conn);
                        total += start.elapsed();
                        frames = 0;
                    }
                    done += 1;
                }
            }
            total
        })
    });
    group.finish();
}

criterion_group!(benches, confirm_flip, apply_rate);
criterion_main!(benches);
